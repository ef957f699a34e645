"""``snet tls init``: a private CA and the certificates of a small cluster.

Writes into a directory (files 0600 for keys):

- ``ca.pem``, ``ca.key``: the cluster's own certificate authority (ten years);
- ``server.pem``, ``server.key``: the server's certificate, for every host name and
  address given (and ``localhost`` and 127.0.0.1), for TLS server authentication;
- ``worker.pem``, ``worker.key``: one certificate every worker may share, for mutual TLS
  (client authentication); ``--workers NAME,...`` makes one per name instead.

Worker names become file names and hosts go into the server's certificate, so both are
checked first (``check_worker_names``, ``check_hosts``): a name that is a path, empty or
repeated, or a host that is neither an IP address nor a DNS name, is one line.

It replaces no file: a directory that holds any file of the set (``ca.pem``, a
``server.pem`` made with another tool, a ``worker.key``) is refused before anything is
written, naming them (``refuse_files_in_the_way``). The files are made in memory, then
written each atomically (transport/files.py), and all or none: when one cannot be written
(a full disk) those written before it and the directories made for them are removed, and
``ResultsNotWritten`` says which and why. A file of the set that another process makes
after the check is not replaced either (``write_atomically(replace=False)``): all or
none again, one line. Written in place, a full disk left an empty or cut ``ca.pem`` (or
key) that later commands read as a broken CA; and when only ``ca.key`` was refused, a
user's own ``server.pem`` was overwritten, and on a full disk removed with the files
written before the failure.

Made with the ``cryptography`` package (the ``tls`` extra; the README says why a library
rather than hand-written ASN.1): ``ssl`` in the standard library reads certificates but
cannot make them.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
from pathlib import Path
from typing import Any

from snet.protocol.errors import ConfigError, ResultsNotWritten

from .files import write_atomically

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


def _made_directories(directory: Path) -> list[Path]:
    """Make ``directory`` (and its missing parents); the ones made, outermost first."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()][::-1]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot use directory {directory}: {exc.strerror}") from exc
    return missing


def _write_all(files: list[tuple[Path, bytes, int]], made: list[Path]) -> None:
    """Write every (path, bytes, mode) atomically, or none (the module docstring)."""
    written: list[Path] = []
    for path, data, mode in files:
        try:
            write_atomically(path, data, mode, replace=False)
        except OSError as exc:  # a full disk, a directory this user may not write
            for done in written:
                done.unlink(missing_ok=True)
            for directory in reversed(made):  # empty again, unless another wrote there
                with contextlib.suppress(OSError):
                    directory.rmdir()
            if isinstance(exc, FileExistsError) and str(path) in (exc.filename, exc.filename2):
                # ``path`` itself, made by another since the check
                raise ConfigError(
                    f"{path} appeared while snet tls init was writing: not overwritten "
                    "(nothing written)"
                ) from exc
            raise ResultsNotWritten(
                f"cannot write {path}: {exc.strerror or exc} (nothing written)"
            ) from exc
        written.append(path)


def refuse_files_in_the_way(directory: Path, names: list[str]) -> None:
    """Refuse ``directory`` if it holds a file of ``names`` (a dangling link too: it
    holds the name), naming every one.

    Why refuse rather than replace (and put back on failure): a file of such a name may be
    the user's own (a ``server.pem`` made with openssl, another cluster's ``worker.key``),
    and replacing it loses it even when every write succeeds; one rule, "it writes only
    names that are free", is the one a user can predict. Its cost: a run killed between
    two files leaves the first few (``ca.key``, written last, never among them), which a
    second run then refuses too; the message names them and says to move them away."""
    present = sorted(name for name in names if os.path.lexists(directory / name))
    if present:
        raise ConfigError(
            f"{directory} already holds {', '.join(present)}: not overwritten (snet tls init "
            "replaces no file: move them away or choose another directory)"
        )


# A worker's name is a file name in the directory (NAME.pem, NAME.key) and a certificate's
# common name: letters, digits, dot, dash and underscore, not starting with a dot (no
# hidden files, no "..", no path), and none of the files the directory already holds.
WORKER_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")
RESERVED_NAMES = ("ca", "server")
# One DNS label (RFC 1123): letters, digits and inner dashes, 1-63 characters.
DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def check_worker_names(names: list[str]) -> None:
    """Refuse a worker name that is empty, a repeat, a path or a reserved file's name."""
    seen: set[str] = set()
    for name in names:
        if not name:
            raise ConfigError("an empty worker name (a stray comma in --workers?)")
        if not WORKER_NAME.fullmatch(name):
            raise ConfigError(
                f"worker name {name!r}: use 1-64 letters, digits, '.', '-' or '_', not "
                "starting with '.' (it names the files NAME.pem and NAME.key)"
            )
        if name in RESERVED_NAMES:
            raise ConfigError(f"worker name {name!r} would overwrite {name}.pem: choose another")
        if name in seen:
            raise ConfigError(f"worker name {name!r} is given twice")
        seen.add(name)


def host_name_problem(host: str) -> str:
    """Why ``host`` cannot go into a server certificate ("" when it can): it must be an IP
    address or a DNS name, whose first label may be the wildcard ``*`` (one label of a
    name of at least two more: ``*.example.com``)."""
    try:
        ipaddress.ip_address(host)
        return ""
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    if labels[0] == "*":
        labels = labels[1:]
        if len(labels) < 2:
            return "a wildcard needs a name of at least two labels after it (*.example.com)"
    if len(host) > 253 or not all(DNS_LABEL.fullmatch(label) for label in labels):
        return "not an IP address or a DNS name (letters, digits and '-' between dots)"
    if labels[-1].isdigit():  # 1.2.3.999: an address mistyped, not a name
        return "not an IP address, and a DNS name's last label is not all digits"
    return ""


def check_hosts(hosts: list[str]) -> None:
    """Refuse a host that is empty or neither an IP address nor a DNS name."""
    for host in hosts:
        if not host:
            raise ConfigError("an empty host (a stray comma in --hosts?)")
        problem = host_name_problem(host)
        if problem:
            raise ConfigError(f"host {host!r}: {problem}")


def make_cluster_certificates(
    directory: Path, hosts: list[str], workers: list[str] | None = None
) -> list[Path]:
    """Write the CA, the server's and the workers' certificates; returns the files.
    Raises ``ConfigError`` for a bad host or worker name or a directory it cannot use,
    ``ResultsNotWritten`` for a file it cannot write (then none is)."""
    check_hosts(hosts)
    check_worker_names(workers or [])
    x509, hashes, serialization, ec, usage, name_oid = _tools()
    stems = ["ca", "server", *(workers or ["worker"])]
    made = _made_directories(directory)
    refuse_files_in_the_way(
        directory, [stem + suffix for stem in stems for suffix in (".pem", ".key")]
    )
    now = datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=365 * YEARS)
    files: list[tuple[Path, bytes, int]] = []  # written once all are made

    def key_pem(key: Any) -> bytes:
        return bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def save(stem: str, cert: Any, key: Any) -> None:
        files.append((directory / f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM),
                      0o644))  # fmt: skip
        files.append((directory / f"{stem}.key", key_pem(key), 0o600))

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
    # ca.key last: a run killed between two files leaves no CA key, so nothing can be
    # signed with a CA whose set is incomplete (a second run names what it left)
    _write_all(sorted(files, key=lambda file: file[0].name == "ca.key"), made)
    return [path for path, _, _ in files]
