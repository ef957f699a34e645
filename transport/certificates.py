"""``snet tls init``: a private CA and the certificates of a small cluster.

Writes into a directory (files 0600 for keys):

- ``ca.pem``, ``ca.key``: the cluster's own certificate authority (ten years);
- ``server.pem``, ``server.key``: the server's certificate, for every host name and
  address given (and ``localhost`` and 127.0.0.1), for TLS server authentication;
- ``worker.pem``, ``worker.key``: one certificate every worker may share, for mutual TLS
  (client authentication); ``--workers NAME,...`` makes one per name instead.

Made with the ``cryptography`` package (the ``tls`` extra; the README says why a library
rather than hand-written ASN.1): ``ssl`` in the standard library reads certificates but
cannot make them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import Any

from snet.protocol.errors import ConfigError

YEARS = 10


def _tools() -> Any:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise ConfigError(
            "snet tls init needs the cryptography package: pip install 'snet-train[tls]'"
        ) from None
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _write(path: Path, data: bytes, secret: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    with os.fdopen(os.open(path, flags, 0o600 if secret else 0o644), "wb") as handle:
        handle.write(data)


def make_cluster_certificates(
    directory: Path, hosts: list[str], workers: list[str] | None = None
) -> list[Path]:
    """Write the CA, the server's and the workers' certificates; returns the files."""
    x509, hashes, serialization, ec, usage, name_oid = _tools()
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "ca.key").exists():
        raise ConfigError(f"{directory} already holds a CA (ca.key): not overwritten")
    now = datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=365 * YEARS)
    written: list[Path] = []

    def key_pem(key: Any) -> bytes:
        return bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def save(stem: str, cert: Any, key: Any) -> None:
        _write(directory / f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM), False)
        _write(directory / f"{stem}.key", key_pem(key), True)
        written.extend([directory / f"{stem}.pem", directory / f"{stem}.key"])

    def named(common_name: str) -> Any:
        return x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, common_name)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(named("snet cluster CA"))
        .issuer_name(named("snet cluster CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    save("ca", ca, ca_key)

    def issue(stem: str, common_name: str, purpose: Any, names: list[Any]) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(named(common_name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        save(stem, builder.sign(ca_key, hashes.SHA256()), key)

    alternatives: list[Any] = []
    for host in dict.fromkeys([*hosts, "localhost", "127.0.0.1"]):
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alternatives.append(x509.DNSName(host))
    issue("server", hosts[0] if hosts else "localhost", usage.SERVER_AUTH, alternatives)
    for name in workers or ["worker"]:
        issue(name, name, usage.CLIENT_AUTH, [])
    return written
