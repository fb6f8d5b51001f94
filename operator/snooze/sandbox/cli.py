"""`snooze sandbox`: serve the Kubernetes API emulator on a port and write a kubeconfig for it."""

from __future__ import annotations

import argparse
import errno
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Then: KUBECONFIG=FILE KUBECACHEDIR=$(mktemp -d) kubectl get pods --validate=false."
        " kubectl needs a fresh KUBECACHEDIR (its discovery cache would hide new CRDs) and"
        " --validate=false on writes (the sandbox serves no OpenAPI schemas)."
    )
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

    from snooze.sandbox import Sandbox

    async def main() -> int:
        sandbox = Sandbox(host=args.host, port=args.port)
        try:
            await sandbox.serve()
        except OSError as exc:
            why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            print(
                f"snooze sandbox: cannot serve on {args.host}:{args.port}: {why}."
                " Choose another --port (0 picks a free one).",
                file=sys.stderr,
            )
            return 2
        path = sandbox.write_kubeconfig(args.kubeconfig)
        print(f"snooze sandbox: serving {sandbox.url}; kubeconfig written to {path}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await sandbox.aclose()
        print("snooze sandbox: stopped", file=sys.stderr)
        return 0

    return asyncio.run(main())
