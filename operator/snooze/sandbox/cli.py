"""`snooze sandbox`: serve the Kubernetes API emulator on a port and write a kubeconfig for it."""

from __future__ import annotations

import argparse
import logging
import sys

log = logging.getLogger(__name__)

# The commands the help suggests; tests/sandbox/test_cli_help.py runs each against a sandbox.
EPILOG = """\
Then, in another terminal, from a clone of the repository:
  export KUBECONFIG=FILE KUBECACHEDIR=$(mktemp -d)
  kubectl apply -f crds/
  kubectl apply -f examples/sandbox/pods.yaml
  kubectl apply -f examples/sandbox/chat.yaml
  kubectl get pods
  kubectl get im
  kubectl explain im.spec

Writes are validated, and `kubectl explain` answered, from the sandbox's OpenAPI documents.
A fresh KUBECACHEDIR keeps what kubectl cached of an earlier sandbox at the same address
(its resources, its documents) from standing in for this one's.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # keeps the commands' lines
    parser.epilog = EPILOG
    parser.add_argument("--port", type=int, required=True, help="TCP port to serve on (0: any)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--kubeconfig",
        required=True,
        metavar="FILE",
        help='write a kubeconfig here (context "snooze-sandbox")',
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from snooze.api.listening import EXIT_CODE, CannotListen, cannot_listen
    from snooze.sandbox import Sandbox

    def say(text: str, *, level: int = logging.INFO, out: bool = False) -> None:
        # Plain lines for people (the README shows them); with --log-format json, records
        # like every other line of the process, for whatever reads them.
        if args.log_format == "json":
            log.log(level, "%s", text)
        else:
            print(f"snooze sandbox: {text}", file=sys.stdout if out else sys.stderr, flush=True)

    async def main() -> int:
        sandbox = Sandbox(host=args.host, port=args.port)
        try:
            await sandbox.serve()
        except OSError as exc:
            taken = CannotListen(args.host, args.port, exc)
            say(
                cannot_listen(taken, what="its API", port_flag="--port", host_flag="--host"),
                level=logging.ERROR,
            )
            return EXIT_CODE
        # Ready for a signal before saying so: whoever stops it on that line stops it cleanly.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        path = sandbox.write_kubeconfig(args.kubeconfig)
        say(f"serving {sandbox.url}; kubeconfig written to {path}", out=True)
        try:
            await stop.wait()
        finally:
            await sandbox.aclose()
        say("stopped")
        return 0

    return asyncio.run(main())
