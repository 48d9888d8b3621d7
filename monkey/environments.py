"""What the core adds to an agent's `start` request for a job described by a job.yml:
the environment to prepare on the worker, the persisted folders and the data folders.

The worker does the work (monkey/client_agent/launcher.py): environments are built once
per worker and key, persisted folders are restored and saved there, data folders are
copied or linked from the worker's dataset store.
"""

from __future__ import annotations

from collections.abc import Callable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SETUP_KEYS = ("env_file", "env_file_digest", "install_script", "install_script_digest")


def needs_setup(spec: dict[str, Any]) -> bool:
    """Whether the job's worker has an environment to prepare."""
    return spec.get("env_type", "none") != "none" or bool(spec.get("install_script"))


def setup_fields(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The ``setup`` of the `start` request for a recorded spec (None: nothing to prepare);
    the worker's environment key is computed from it (launcher.env_key)."""
    if not needs_setup(spec):
        return None
    return {"type": spec.get("env_type", "none"), **{k: spec.get(k) for k in SETUP_KEYS}}


def start_fields(
    spec: dict[str, Any], manifest: Callable[[str], list[Any]], persist_dir: str
) -> tuple[dict[str, Any], list[str]]:
    """(fields of the `start` request, blobs the worker needs) for a recorded spec."""
    fields: dict[str, Any] = {}
    blobs: list[str] = []
    setup = setup_fields(spec)
    if setup is not None:
        fields["setup"] = setup
    if spec.get("persist"):
        fields["persist"] = [{"name": p["name"], "path": p["path"]} for p in spec["persist"]]
        fields["persist_dir"] = persist_dir
    placed = []
    for data in spec.get("data", []):
        files = [f[:3] for f in manifest(data["digest"])]
        blobs += [f[1] for f in files]
        placed.append(
            {
                "path": data["path"],
                "digest": data["digest"],
                "files": files,
                "mount": data.get("type") == "mount",
            }
        )
    if placed:
        fields["placed"] = placed
    return fields, blobs
