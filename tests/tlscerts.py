"""Real certificates for the TLS tests, made with the ``openssl`` CLI: a CA, and a node certificate it signs for
``localhost``/``127.0.0.1`` that serves both as the listener's and as a peer's client certificate; a second CA and a
certificate from it for "a stranger"."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
LEAF_EXT = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature\n"
    "extendedKeyUsage=serverAuth,clientAuth\n"
    "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid,issuer\n"
)


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(directory: Path, name: str = "node") -> Pki:
    """``directory/NAME-ca.pem`` and ``NAME.pem``/``NAME.key`` signed by it (keys mode 0600)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = f"{name}-ca.pem", f"{name}-ca.key"
    _openssl("req", "-x509", *EC, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", f"/CN={name} test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=directory)  # fmt: skip
    _openssl("req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=localhost", cwd=directory)
    (directory / f"{name}.ext").write_text(LEAF_EXT)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)  # fmt: skip
    for key in (ca_key, f"{name}.key"):
        os.chmod(directory / key, 0o600)
    return Pki(directory / ca, directory / f"{name}.pem", directory / f"{name}.key")


def write_token(path: Path, value: str) -> Path:
    """A token file as the daemon wants it: a regular file of ours, mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")
    os.chmod(path, 0o600)
    return path
