"""Sending one notification: a Slack incoming webhook (Block Kit), a signed JSON webhook, or
an email through SMTP; and what a target's URL may be.

A message is a dict made when the event was taken from the outbox (see
``monkey.core.notifier.message``): ``text`` (one line), ``title``, ``fields`` (label, value),
``output`` (last lines of a failure), ``url`` (the job's page, when a server URL is known)
and the data a program wants (``event``, ``job``, ``sweep``...). It is sent as it was made,
however often it is tried again.

Webhook receivers check each request with the target's signing key::

    X-Monkey-Timestamp: 1764300000              (Unix seconds of this try)
    X-Monkey-Delivery: 3f0c...                  (idempotency id: the same on every try)
    X-Monkey-Signature: sha256=HEX(HMAC-SHA256(key, timestamp + "." + body))

and refuse a timestamp more than a few minutes old (a replay) and a delivery id seen before.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import ssl
import time
from urllib.parse import urlsplit

from monkey.core.reach import Reach, Refused, connect, resolve
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TIMEOUT = 10.0  # seconds for each send (connect, TLS, answer)
KINDS = ("slack", "webhook", "email")
TLS_MODES = ("starttls", "ssl", "plain")


class SendError(Exception):
    """A send failed, in one line; ``permanent``: trying again will not help (a refused
    payload, a login refused)."""

    def __init__(self, line: str, permanent: bool = False) -> None:
        super().__init__(line)
        self.permanent = permanent


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(url: str, what: str) -> str:
    """URL when it may receive messages: https anywhere, plain http to loopback only;
    MonkeyError in one line naming the fix otherwise."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        raise MonkeyError(f"{what} URL {url!r} is malformed ({exc})") from None
    if parts.scheme not in ("https", "http") or not host:
        raise MonkeyError(
            f"{what} URL {url!r} is malformed; give https://HOST/PATH (e.g. "
            "https://hooks.slack.com/services/...)"
        )
    if parts.scheme == "http" and not is_loopback(host):
        raise MonkeyError(
            f"{what} URL {url!r} is plain http to {host}: only https may leave this "
            "machine (plain http is for 127.0.0.1, ::1 or localhost); use https://"
        )
    return url.strip()


def mask_url(url: str) -> str:
    """URL as `notify list` shows it: scheme, host and port, and the last 4 characters."""
    parts = urlsplit(url)
    tail = url.rstrip("/")[-4:]
    return f"{parts.scheme}://{parts.netloc}/…/{tail}"


# -- payloads -------------------------------------------------------------------------


def slack_payload(msg: dict[str, Any]) -> dict[str, Any]:
    """Slack's incoming-webhook body: ``text`` (the notification's fallback) and Block Kit
    ``blocks``: a header section, a section of fields, the output in a code block, and a
    context block with the link."""
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{msg['title']}*"}},
    ]
    fields = [{"type": "mrkdwn", "text": f"*{label}*\n{value}"} for label, value in msg["fields"]][
        :10
    ]  # Slack allows 10 fields in a section
    if fields:
        blocks.append({"type": "section", "fields": fields})
    if msg.get("output"):
        text = "\n".join(msg["output"])[-2900:]  # a text object holds 3,000 characters
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"```{text}```"}})
    context = [{"type": "mrkdwn", "text": msg.get("footer") or "monkey"}]
    if msg.get("url"):
        context.append({"type": "mrkdwn", "text": f"<{msg['url']}|open in Monkey Web>"})
    blocks.append({"type": "context", "elements": context})
    return {"text": msg["text"], "blocks": blocks}


def webhook_body(msg: dict[str, Any], delivery: str) -> bytes:
    """The JSON a webhook receives: the message without its presentation, with its id."""
    data = {k: v for k, v in msg.items() if k not in ("fields", "footer")}
    return json.dumps({"delivery": delivery, **data}, sort_keys=True).encode()


def sign(key: str, timestamp: str, body: bytes) -> str:
    """X-Monkey-Signature's value for BODY sent at TIMESTAMP."""
    mac = hmac.new(key.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def email_text(msg: dict[str, Any]) -> str:
    lines = [msg["title"], ""]
    lines += [f"{label}: {value}" for label, value in msg["fields"]]
    if msg.get("output"):
        lines += ["", "Last lines of output:", *("  " + line for line in msg["output"])]
    if msg.get("url"):
        lines += ["", msg["url"]]
    return "\n".join(lines) + "\n"


# -- sending --------------------------------------------------------------------------


def send(
    target: dict[str, Any],
    secret: dict[str, Any],
    msg: dict[str, Any],
    delivery: str,
    reach: Reach | None = None,
) -> None:
    """Send MSG to TARGET (its ``kind`` and ``options``; SECRET: its URL, key, password)
    with idempotency id DELIVERY, only to addresses REACH allows (None: any; see
    ``monkey.core.reach``); SendError in one line when it failed."""
    if target["kind"] == "email":
        _send_email(target["options"], secret, msg, delivery, reach)
        return
    if target["kind"] == "slack":
        body = json.dumps(slack_payload(msg)).encode()
        headers = {"X-Monkey-Delivery": delivery}
    else:
        body = webhook_body(msg, delivery)
        stamp = str(int(time.time()))
        headers = {
            "X-Monkey-Timestamp": stamp,
            "X-Monkey-Delivery": delivery,
            "X-Monkey-Signature": sign(secret["key"], stamp, body),
        }
    _post(secret["url"], body, headers, reach)


def _addresses(where: str, host: str, port: int, reach: Reach | None) -> list[tuple[int, Any]]:
    """HOST's addresses that REACH allows (see ``reach.resolve``); SendError otherwise."""
    try:
        return resolve(host, port, reach)
    except Refused as exc:
        raise SendError(str(exc), permanent=True) from None
    except (OSError, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or "no address"
        raise SendError(f"{where}: cannot resolve {host} ({why})") from None


def _post(url: str, body: bytes, headers: dict[str, str], reach: Reach | None) -> None:
    """POST BODY to URL: its name resolved once, the connection made to an address REACH
    allows, the name kept for Host and TLS; a redirect is not followed."""
    import http.client
    import ssl

    parts = urlsplit(url)
    where = parts.netloc.rpartition("@")[2]
    tls = parts.scheme == "https"
    try:
        name, port = parts.hostname or "", parts.port or (443 if tls else 80)
    except ValueError:
        raise SendError(f"{where}: the URL cannot be sent to; add the target again", True) from None
    addresses = _addresses(where, name, port, reach)
    conn = _Pinned(name, port, addresses, ssl.create_default_context() if tls else None)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(
            "POST",
            path,
            body,
            {"Content-Type": "application/json", "User-Agent": "monkey", **headers},
        )
        answer = conn.getresponse()
        status, reason = answer.status, answer.reason
        why = answer.read(200 if status >= 300 else 65536)
    except ssl.SSLCertVerificationError as exc:
        raise SendError(
            f"TLS error with {where}: {exc.verify_message or exc} (its certificate "
            "is not trusted here; SSL_CERT_FILE names a CA file)"
        ) from None
    except ssl.SSLError as exc:
        raise SendError(f"TLS error with {where}: {exc.reason or 'the handshake failed'}") from None
    except ConnectionRefusedError:
        raise SendError(f"{where}: connection refused") from None
    except TimeoutError:
        raise SendError(f"{where}: no answer within {TIMEOUT:.0f}s") from None
    except http.client.HTTPException:  # its text would show what the peer sent
        raise SendError(f"{where}: the answer is not HTTP") from None
    except OSError as exc:
        raise SendError(f"{where}: {exc.strerror or type(exc).__name__}") from None
    except ValueError:  # http.client.InvalidURL and the like: its text would show the URL
        raise SendError(f"{where}: the URL cannot be sent to; add the target again", True) from None
    finally:
        conn.close()
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        raise SendError(
            f"{where} answered HTTP {status} {reason}, a redirect, which is not followed; "
            "give the target's final URL",
            permanent=True,
        )
    permanent = 400 <= status < 500 and status not in (408, 425, 429)
    lines = why.decode(errors="replace").strip().splitlines()
    raise SendError(
        f"{where} answered HTTP {status} {reason}" + (f": {lines[0]}" if lines else ""), permanent
    )


class _Pinned(http.client.HTTPConnection):
    """An HTTP(S) connection to NAME made to one of ADDRESSES (checked already): Host and
    the TLS server name are NAME."""

    def __init__(
        self,
        name: str,
        port: int,
        addresses: list[tuple[int, Any]],
        context: ssl.SSLContext | None,
    ) -> None:
        super().__init__(name, port, timeout=TIMEOUT)
        self.addresses, self.context = addresses, context

    def connect(self) -> None:
        sock = connect(self.addresses, TIMEOUT)
        if self.context is not None:
            try:
                sock = self.context.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock


def _send_email(
    options: dict[str, Any],
    secret: dict[str, Any],
    msg: dict[str, Any],
    delivery: str,
    reach: Reach | None = None,
) -> None:
    """Plain text mail through OPTIONS' SMTP server: STARTTLS (default), SSL, or plain (to
    loopback only), logged in when a user is given; SendError in one line."""
    from email.message import EmailMessage

    mail = EmailMessage()
    mail["Subject"] = msg["text"][:200]
    mail["From"] = options["from"]
    mail["To"] = ", ".join(options["to"])
    mail["Message-ID"] = f"<{delivery}@monkey>"  # the same on every try: mail readers dedupe
    mail["X-Monkey-Delivery"] = delivery
    mail.set_content(email_text(msg))
    with smtp_session(options, secret, reach) as smtp:
        try:
            smtp.send_message(mail)
        except Exception as exc:  # noqa: BLE001 - smtplib's errors, in one line
            raise SendError(f"SMTP {options['host']}: {_smtp_error(exc)}") from None


class smtp_session:  # noqa: N801 - used as a context manager
    """A logged-in SMTP connection to OPTIONS' server, made to an address REACH allows;
    SendError in one line otherwise, naming the failure's class, never the peer's words
    (a port that is no mail server could show what it says to anyone)."""

    def __init__(
        self, options: dict[str, Any], secret: dict[str, Any], reach: Reach | None = None
    ) -> None:
        self.options, self.secret, self.reach = options, secret, reach

    def __enter__(self) -> Any:
        import smtplib

        o = self.options
        where = f"SMTP {o['host']}:{o['port']}"
        context = ssl.create_default_context()
        addresses = _addresses(where, o["host"], o["port"], self.reach)
        try:
            smtp = _pinned_smtp(o["tls"] == "ssl", addresses, context)(
                o["host"], o["port"], timeout=TIMEOUT
            )
            self.smtp = smtp
            smtp.ehlo()
            if o["tls"] == "starttls":
                if not smtp.has_extn("starttls"):
                    smtp.close()
                    raise SendError(
                        f"{where} does not offer STARTTLS; use --ssl, or --plain on loopback",
                        permanent=True,
                    )
                smtp.starttls(context=context)
                smtp.ehlo()
            if o.get("user"):
                smtp.login(o["user"], self.secret.get("password") or "")
        except SendError:
            raise
        except smtplib.SMTPAuthenticationError as exc:
            self._close()
            raise SendError(
                f"{where} refused the login of {o['user']!r} ({_smtp_error(exc)}); check "
                "--user and the password",
                permanent=True,
            ) from None
        except ssl.SSLCertVerificationError as exc:
            self._close()
            raise SendError(
                f"TLS error with {where}: {exc.verify_message or exc} (its certificate is not "
                "trusted here; SSL_CERT_FILE names a CA file)"
            ) from None
        except ssl.SSLError as exc:
            self._close()
            raise SendError(
                f"TLS error with {where}: {exc.reason or 'the handshake failed'}"
            ) from None
        except (TimeoutError, OSError, smtplib.SMTPException) as exc:
            self._close()
            raise SendError(f"{where}: {_smtp_error(exc)}") from None
        return smtp

    def _close(self) -> None:
        smtp = getattr(self, "smtp", None)
        if smtp is not None:
            try:
                smtp.close()
            except OSError:
                pass

    def __exit__(self, *exc: object) -> None:
        try:
            self.smtp.quit()
        except Exception:  # noqa: BLE001 - the message went (or the error is raised already)
            self._close()


def _pinned_smtp(tls: bool, addresses: list[tuple[int, Any]], context: ssl.SSLContext) -> Any:
    """smtplib's SMTP (SMTP_SSL when TLS) class connecting to one of ADDRESSES (checked
    already), the server's name kept for TLS."""
    import smtplib

    class Pinned(smtplib.SMTP):
        def _get_socket(self, host: str, port: int, timeout: float) -> Any:
            sock = connect(addresses, timeout)
            if not tls:
                return sock
            try:
                return context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise

    return Pinned


def _smtp_error(exc: BaseException) -> str:
    """What went wrong, by its class: never the words the peer sent."""
    import smtplib

    code = getattr(exc, "smtp_code", None)
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return f"no answer within {TIMEOUT:.0f}s"
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return "the server closed the connection"
    if isinstance(code, int) and 200 <= code < 600:
        return f"the server answered code {code}"
    if isinstance(exc, smtplib.SMTPException):
        return "the server does not speak SMTP"
    return str(getattr(exc, "strerror", None) or type(exc).__name__)
