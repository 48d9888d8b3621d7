"""The server's certificate: a self-signed one made on first start (``cryptography``), or
the user's (--cert/--key); its SHA-256 fingerprint is what clients pin."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from pathlib import Path

from monkey.config import write_private
from monkey.models import MonkeyError


def names_for(bind_host: str) -> list[str]:
    """The names a certificate for BIND_HOST is made for: it, localhost, 127.0.0.1, and this
    machine's names when it binds every address."""
    names = [bind_host, "localhost", "127.0.0.1", "::1"]
    if bind_host in ("0.0.0.0", "::", ""):
        names += [socket.gethostname(), socket.getfqdn()]
    return list(dict.fromkeys(n for n in names if n and n not in ("0.0.0.0", "::")))


def make_self_signed(cert: Path, key: Path, names: list[str], days: int = 3650) -> None:
    """Write a self-signed certificate for NAMES to CERT and its key to KEY (0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"monkey server {names[0]}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    write_private(
        key,
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    write_private(cert, certificate.public_bytes(serialization.Encoding.PEM))
    os.chmod(cert, 0o644)  # the certificate is public; its key is not


def fingerprint(cert: Path) -> str:
    """``SHA256:<hex>`` of the certificate in CERT (PEM), as clients compute it."""
    import hashlib
    import ssl

    try:
        der = ssl.PEM_cert_to_DER_cert(cert.read_text())
    except (OSError, ValueError) as exc:
        raise MonkeyError(
            f"{cert} is not a readable PEM certificate ({exc}); give --cert a PEM file"
        ) from None
    return "SHA256:" + hashlib.sha256(der).hexdigest()
