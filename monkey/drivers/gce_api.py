"""libcloud's GCENodeDriver for one `type: gce` provider entry.

The entry's `credentials` is a service-account JSON key file; it is read here, handed to
libcloud (which signs its token requests with the key) and never copied anywhere. With
`endpoint` set, the driver talks to that compute-API-compatible server (an emulator, the
tests' fake) instead of Google, and sends it no Google token.

Import this module only where a cloud call is made: it loads libcloud.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from libcloud.common.base import ConnectionUserAndKey
from libcloud.compute.drivers.gce import GCEConnection, GCENodeDriver

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home


def service_account(path: str) -> dict[str, Any]:
    """The service-account key file at PATH, checked (client_email, private_key)."""
    full = os.path.expanduser(path)
    try:
        with open(full) as fh:
            account = json.load(fh)
    except FileNotFoundError:
        raise MonkeyError(
            f"credentials {path}: no such file; name a service-account JSON key "
            "(IAM > Service accounts > Keys > Add key > JSON)"
        ) from None
    except (OSError, ValueError) as exc:
        raise MonkeyError(
            f"credentials {path}: not a readable JSON file ({exc}); name a service-account JSON key"
        ) from None
    if (
        not isinstance(account, dict)
        or account.get("type") != "service_account"
        or not account.get("client_email")
        or not account.get("private_key")
    ):
        raise MonkeyError(
            f"credentials {path}: not a service-account key (needs type "
            "service_account, client_email, private_key); download a JSON key"
        )
    return account


def zones(entry: dict[str, Any]) -> list[str]:
    """The entry's zones, its preferred one first."""
    return list(entry.get("zones") or [entry["zone"]])


class _NoToken:
    access_token = "none"  # an emulator checks no token: none is ever fetched for it


class _EndpointConnection(GCEConnection):
    """GCEConnection to a compute-API-compatible server: no OAuth2 credential is built (it
    would read cached tokens or ask Google for one); requests go to HOST:PORT."""

    poll_interval = 0.05

    def __init__(
        self,
        user_id: str,
        key: Any,
        secure: bool,
        host: str | None = None,
        port: int | None = None,
        auth_type: Any = None,
        credential_file: Any = None,
        project: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("scopes", None)
        ConnectionUserAndKey.__init__(
            self, user_id, key, secure=secure, host=host, port=port, **kwargs
        )
        self.oauth2_credential = _NoToken()
        self.request_path = f"/compute/v1/projects/{project}"
        self.gce_params = None


class _EndpointGCENodeDriver(GCENodeDriver):
    # mypy compares the constructors: this GCEConnection (a test endpoint, no OAuth) has its own
    connectionCls = _EndpointConnection  # type: ignore[assignment]


def project_of(entry: dict[str, Any]) -> str:
    """The entry's project, else its service account's."""
    project = entry.get("project") or service_account(entry["credentials"]).get("project_id")
    if not project:
        raise MonkeyError("no GCE project: pass --project (the service-account key names none)")
    return str(project)


def token_cache(home: Home, account: dict[str, Any]) -> Path:
    """Where libcloud caches the service account's OAuth2 token: MONKEY_HOME's private
    folder (0700; libcloud creates the file 0600), never libcloud's default
    ``~/.google_libcloud_auth.<email>`` in the user's home."""
    return home.private / f"gce-token.{account['client_email']}"


def gce_node_driver(entry: dict[str, Any], home: Home) -> GCENodeDriver:
    """libcloud's GCE driver for a validated entry, in its first zone. Against Google, its
    token is cached under HOME (see :func:`token_cache`); at an `endpoint` none is made."""
    account = service_account(entry["credentials"])
    kwargs: dict[str, Any] = {"project": project_of(entry), "datacenter": zones(entry)[0]}
    cls = GCENodeDriver
    if entry.get("endpoint"):
        parts = urlsplit(entry["endpoint"])
        secure = parts.scheme == "https"
        kwargs.update(
            host=parts.hostname, port=parts.port or (443 if secure else 80), secure=secure
        )
        cls = _EndpointGCENodeDriver
    else:
        home.private.mkdir(mode=0o700, parents=True, exist_ok=True)
        kwargs.update(auth_type="SA", credential_file=str(token_cache(home, account)))
    return cls(account["client_email"], os.path.expanduser(entry["credentials"]), **kwargs)
