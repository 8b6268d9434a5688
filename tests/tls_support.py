"""Certificates the TLS tests make for themselves: a CA, a server certificate for 127.0.0.1 and
localhost signed by it, and a client certificate (for mutual TLS) signed by it. EC P-256 keys,
so making a set takes milliseconds."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True, slots=True)
class Certs:
    """PEM files in one folder."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_context(self, require_client: bool = False) -> ssl.SSLContext:
        """A server presenting `server_cert`; with `require_client`, only clients whose
        certificate `ca` signed get through the handshake."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server_cert, self.server_key)
        if require_client:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.ca)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client trusting `ca` (no client certificate)."""
        return ssl.create_default_context(cafile=self.ca)


def make_certs(folder: Path, name: str = "unitgate-test") -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(f"{name} CA", ca_key, ca_key, None, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("127.0.0.1", server_key, ca_key, ca, server=True)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate(f"{name} client", client_key, ca_key, ca)
    paths = Certs(
        folder / "ca.pem",
        folder / "server.pem",
        folder / "server.key",
        folder / "client.pem",
        folder / "client.key",
    )
    _write_cert(paths.ca, ca)
    _write_cert(paths.server_cert, server)
    _write_key(paths.server_key, server_key)
    _write_cert(paths.client_cert, client)
    _write_key(paths.client_key, client_key)
    return paths


def _certificate(
    common_name: str,
    key: Key,
    signer: Key,
    issuer: x509.Certificate | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    else:
        assert issuer is not None
        authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key())
        purpose = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(authority, critical=False).add_extension(
            x509.ExtendedKeyUsage([purpose]), critical=False
        )
    if server:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: Key) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_bytes(pem)
    path.chmod(0o600)
