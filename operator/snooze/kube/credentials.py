"""Kubernetes credentials, found and renewed as kubectl finds them, by the `kubernetes` library.

Where: `--kubeconfig FILE` (and `--context`), else `KUBECONFIG` (a list of files, merged),
else the pod's service account, else `~/.kube/config`. What: whatever the kubeconfig's user
says (a token or token file, client certificates, an exec plugin as EKS, GKE and AKS
kubeconfigs use, an auth provider), read by the library's own loaders. A login is renewed
when it expires (an exec credential's expirationTimestamp) and whenever the API answers 401
(a service account's token file, which the kubelet rotates, is then read again).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import kopf
import yaml

log = logging.getLogger(__name__)

DEFAULT_KUBECONFIG = Path("~/.kube/config")


class CredentialsError(Exception):
    """No usable credentials; the message is one line that names the file or setting to fix."""


@dataclass(frozen=True, kw_only=True)
class Login:
    """What one login gave: where the API is, and how to prove who we are."""

    server: str
    authorization: str | None = None
    """The whole Authorization header value (`Bearer ...`, or `Basic ...`)."""
    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    insecure: bool = False
    proxy: str | None = None
    expires: datetime.datetime | None = None
    """When to log in again before using it (timezone-aware); None: until refused (401)."""

    def expired(self, *, margin: float = 10.0) -> bool:
        if self.expires is None:
            return False
        now = datetime.datetime.now(datetime.UTC)
        return now >= self.expires - datetime.timedelta(seconds=margin)

    def connection_info(self) -> kopf.ConnectionInfo:
        """The same login for kopf, which logs in again at `expiration` and after a 401."""
        scheme, _, token = (self.authorization or "").partition(" ")
        return kopf.ConnectionInfo(
            server=self.server,
            ca_path=self.ca_path,
            insecure=self.insecure,
            scheme=scheme or None,
            token=token or None,
            certificate_path=self.cert_path,
            private_key_path=self.key_path,
            proxy_url=self.proxy,
            expiration=self.expires,
        )


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where credentials come from; `login()` reads them (it may run an exec plugin)."""

    kubeconfig: tuple[str, ...] = ()
    """Kubeconfig files, merged in order; empty: the pod's service account."""
    context: str | None = None
    origin: str = ""
    """Where the files came from, for messages: --kubeconfig, KUBECONFIG or the default."""

    def describe(self) -> str:
        if not self.kubeconfig:
            return "the pod's service account"
        files = os.pathsep.join(self.kubeconfig)
        where = f"kubeconfig {files} ({self.origin})" if self.origin else f"kubeconfig {files}"
        return f"{where}, context {self.context}" if self.context else where

    def login(self) -> Login:
        """Log in now; CredentialsError says what is wrong in one line."""
        # The library's config loaders carry no type hints (hence the ignores below).
        from kubernetes import client, config
        from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

        configuration = client.Configuration()
        errors: list[str] = []
        expires: datetime.datetime | None = None
        try:
            if self.kubeconfig:
                # What config.load_kube_config does, keeping the loader: it alone knows when
                # an exec plugin's credential expires.
                merged = KubeConfigMerger(os.pathsep.join(self.kubeconfig))  # type: ignore[no-untyped-call]
                if merged.config is None:
                    raise config.ConfigException("no configuration found in it")
                loader = KubeConfigLoader(  # type: ignore[no-untyped-call]
                    config_dict=merged.config, active_context=self.context, config_base_path=None
                )
                with _library_errors() as errors:
                    loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
                expires = _aware(getattr(loader, "expiry", None))
            else:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise CredentialsError(f"{self.describe()}: {_first_line(exc)}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or _first_line(exc)
            raise CredentialsError(f"{self.describe()}: not valid YAML{where}: {problem}") from None
        except Exception as exc:  # the loaders fail on a malformed file in many ways
            why = f"{type(exc).__name__}: {_first_line(exc)}"
            raise CredentialsError(f"{self.describe()}: not a usable kubeconfig ({why})") from None
        authorization = configuration.auth_settings().get("BearerToken", {}).get("value")
        if errors and not authorization and not configuration.cert_file:
            # The library logs an exec plugin's failure and carries on without credentials.
            raise CredentialsError(f"{self.describe()}: {errors[0]}")
        return Login(
            server=str(configuration.host).rstrip("/"),
            authorization=authorization,
            ca_path=configuration.ssl_ca_cert,
            cert_path=configuration.cert_file,
            key_path=configuration.key_file,
            insecure=not configuration.verify_ssl,
            proxy=configuration.proxy,
            expires=expires,
        )


def find(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
) -> Source:
    """Where to log in from, as kubectl chooses; CredentialsError names a file that is
    missing or unreadable. Reads no credentials yet (see Source.login)."""
    if kubeconfig is not None:
        return Source(kubeconfig=(_readable(kubeconfig),), context=context, origin="--kubeconfig")
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        # As kubectl: files of the list that do not exist are skipped, but not all of them.
        present = [p for p in listed if Path(p).expanduser().exists()]
        if not present:
            raise CredentialsError(
                f"cannot read kubeconfig {os.pathsep.join(listed)} (KUBECONFIG): "
                "no such file; point KUBECONFIG or --kubeconfig at an existing kubeconfig"
            )
        files = tuple(_readable(p) for p in present)
        return Source(kubeconfig=files, context=context, origin="KUBECONFIG")
    if environ.get("KUBERNETES_SERVICE_HOST") and context is None:
        return Source()
    default = DEFAULT_KUBECONFIG.expanduser()
    if default.exists():
        return Source(kubeconfig=(_readable(str(default)),), context=context, origin="default")
    raise CredentialsError(
        "no Kubernetes credentials found: give --kubeconfig FILE or set KUBECONFIG (for "
        "example to the file that `snooze sandbox --kubeconfig FILE` writes), or run in a "
        "pod with a service account"
    )


def _readable(path: str) -> str:
    try:
        with Path(path).expanduser().open("rb"):
            pass
    except OSError as exc:
        raise CredentialsError(f"cannot read kubeconfig {path}: {exc.strerror}") from None
    return str(Path(path).expanduser())


@dataclass
class _Default:
    source: Source | None = None


_DEFAULT = _Default()


def use(source: Source) -> None:
    """Make `source` the process's credentials (the command line's --kubeconfig, --context)."""
    _DEFAULT.source = source


def use_or_exit(command: str, kubeconfig: str | None, context: str | None) -> Source:
    """For a command line: find the credentials and log in once, so that a missing file, an
    unknown context or a failing exec plugin is one line on stderr and exit status 2."""
    try:
        source = find(kubeconfig, context)
        source.login()
    except CredentialsError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    use(source)
    return source


def default() -> Source:
    """The source given to `use`, else the one `find()` picks from the environment now."""
    return _DEFAULT.source or find()


@contextlib.contextmanager
def _library_errors() -> Iterator[list[str]]:
    """The errors the kubernetes library logs while it loads a kubeconfig (it logs an exec
    plugin's failure instead of raising it), kept for our one-line message and not printed."""
    found: list[str] = []
    library = os.path.join("kubernetes", "config", "")

    def keep(record: logging.LogRecord) -> bool:
        if library not in record.pathname:
            return True
        if record.levelno >= logging.ERROR:
            found.append(_first_line(record.getMessage()))
        return False

    # A filter on the root logger sees only records logged on it, as the library's are.
    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield found
    finally:
        root.removeFilter(keep)


def _first_line(error: object) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _aware(moment: object) -> datetime.datetime | None:
    if not isinstance(moment, datetime.datetime):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)
