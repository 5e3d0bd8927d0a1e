"""The local stack's own TLS identity: a self-signed certificate for 127.0.0.1 that its clients pin.

A client of the stack's Prefect API trusts this one certificate (``PREFECT_API_SSL_CERT_FILE``) and nothing else, so
whatever else listens on the API's port (another local user who got there first) fails the TLS handshake before the
client sends its auth string. The private key is 0600 in the stack's 0700 secrets folder; the certificate is made
once per stack (its data folder) and kept, so a browser's exception for it lasts.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

CERT_NAME, KEY_NAME = "prefect-api.crt", "prefect-api.key"
VALID_DAYS = 3650


def certificate_files(secrets: Path) -> tuple[Path, Path]:
    """The certificate and key in ``secrets`` (a private folder), made when either is missing."""
    from tasks.core.private_folder import write_secret

    cert, key = secrets / CERT_NAME, secrets / KEY_NAME
    if cert.exists() and key.exists():
        return cert, key
    cert_pem, key_pem = _self_signed()
    return write_secret(cert, cert_pem), write_secret(key, key_pem)


def _self_signed() -> tuple[bytes, bytes]:
    """A P-256 key and a certificate for IP 127.0.0.1 and localhost, its own issuer (PEM, PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pipelines local stack")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem
