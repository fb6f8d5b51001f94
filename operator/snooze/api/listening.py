"""How every `snooze` command says it cannot listen where its flags ask: one line naming the
address, why, and the flag to change, the same from the gateway, the operator, the simulator,
the sandbox and the demo, which then exit with EXIT_CODE, as for any other bad input."""

from __future__ import annotations

import errno
import sys

EXIT_CODE = 2
"""The exit code of a command that cannot listen (argparse's, for a bad command line)."""

_WHY = {
    errno.EADDRINUSE: "the port is in use",
    errno.EADDRNOTAVAIL: "the address is not one of this machine's",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}


class CannotListen(Exception):
    """A server cannot listen on its address: the port is in use, the address is not this
    machine's, or listening there is not allowed."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        self.host, self.port, self.errno = host, port, error.errno
        self.reason = _WHY.get(error.errno or 0, error.strerror or str(error))
        super().__init__(f"cannot serve on {_address(host, port)}: {self.reason}")


def cannot_listen(
    exc: CannotListen,
    *,
    what: str,
    port_flag: str,
    host_flag: str | None = None,
    zero_picks: bool = True,
) -> str:
    """The line to print after `snooze COMMAND: `: what could not be served where, why, and
    which flag to change: `host_flag` for an address not this machine's, else `port_flag`
    (`zero_picks`: whether 0 asks that flag for a free port)."""
    if exc.errno == errno.EADDRNOTAVAIL and host_flag is not None:
        fix = f"give another {host_flag}"
    else:
        stop = "stop what holds it, or " if exc.errno == errno.EADDRINUSE else ""
        fix = f"{stop}give another {port_flag}" + (" (0 picks a free one)" if zero_picks else "")
    return f"cannot serve {what} on {_address(exc.host, exc.port)}: {exc.reason}; {fix}"


def exit_cannot_listen(
    command: str,
    exc: CannotListen,
    *,
    what: str,
    port_flag: str,
    host_flag: str | None = None,
    zero_picks: bool = True,
) -> int:
    """Print that line on stderr as `snooze COMMAND: ...`; EXIT_CODE, for `run` to return."""
    line = cannot_listen(
        exc, what=what, port_flag=port_flag, host_flag=host_flag, zero_picks=zero_picks
    )
    print(f"snooze {command}: {line}", file=sys.stderr)
    return EXIT_CODE


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
