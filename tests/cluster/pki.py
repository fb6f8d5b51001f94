"""The certificates and keys of a test cluster, made with openssl: a CA, the API server's
serving certificate, client certificates per component, and the service-account signing key."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as files."""

    cert: Path
    key: Path


class Authority:
    """A self-signed CA in `directory` that signs the cluster's certificates."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cert = directory / "ca.crt"
        self.key = directory / "ca.key"
        _openssl("genrsa", "-out", self.key.name, "2048", cwd=directory)
        _openssl(
            "req", "-x509", "-new", "-key", self.key.name, "-days", "2", "-sha256",
            "-subj", "/CN=snooze-test-ca", "-out", self.cert.name, cwd=directory,
        )  # fmt: skip

    def issue(
        self,
        name: str,
        *,
        common_name: str,
        organization: str | None = None,
        hosts: tuple[str, ...] = (),
        server: bool = False,
    ) -> Pair:
        """A certificate for `common_name` (the user name the API server sees) in the group
        `organization`, valid for `hosts` (IP addresses or DNS names) when it serves."""
        key = self.directory / f"{name}.key"
        csr = self.directory / f"{name}.csr"
        cert = self.directory / f"{name}.crt"
        ext = self.directory / f"{name}.ext"
        subject = f"/CN={common_name}" + (f"/O={organization}" if organization else "")
        usage = "serverAuth" if server else "clientAuth"
        lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
        ]
        if hosts:
            names = [f"IP:{h}" if h[0].isdigit() else f"DNS:{h}" for h in hosts]
            lines.append("subjectAltName=" + ",".join(names))
        ext.write_text("\n".join(lines) + "\n")
        _openssl("genrsa", "-out", key.name, "2048", cwd=self.directory)
        _openssl("req", "-new", "-key", key.name, "-subj", subject, "-out", csr.name,
                 cwd=self.directory)  # fmt: skip
        _openssl(
            "x509", "-req", "-in", csr.name, "-CA", self.cert.name, "-CAkey", self.key.name,
            "-CAcreateserial", "-days", "2", "-sha256", "-extfile", ext.name, "-out", cert.name,
            cwd=self.directory,
        )  # fmt: skip
        return Pair(cert=cert, key=key)


def service_account_keys(directory: Path) -> Pair:
    """The key pair that signs and verifies service-account tokens (the "cert" is the public
    key, as --service-account-key-file takes it)."""
    key = directory / "sa.key"
    public = directory / "sa.pub"
    _openssl("genrsa", "-out", key.name, "2048", cwd=directory)
    _openssl("rsa", "-in", key.name, "-pubout", "-out", public.name, cwd=directory)
    return Pair(cert=public, key=key)
