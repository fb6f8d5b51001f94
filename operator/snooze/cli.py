"""The `snooze` command: one entry point, a subcommand per part, each imported only when run."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import cast

from snooze import __version__
from snooze.extras import missing

# Subcommand -> (module, one-line help). Each module offers `add_arguments(parser)` and
# `run(args) -> int`, and imports its heavy parts (kopf, aiohttp) inside `run`, so that
# `snooze crd` does not pay for the operator.
COMMANDS: dict[str, tuple[str, str]] = {
    "crd": (
        "snooze.api.crd",
        "print the CustomResourceDefinitions (InferenceModel, GPUPool) as YAML",
    ),
    "sim": ("snooze.sim.cli", "serve simulated vLLM engines that speak vLLM's sleep-mode contract"),
    "sandbox": ("snooze.sandbox.cli", "serve a Kubernetes API emulator and write a kubeconfig"),
    "operator": (
        "snooze.operator.cli",
        "run the operator: sleep idle engines, wake them on request",
    ),
    "gateway": (
        "snooze.gateway.cli",
        "serve the OpenAI-compatible gateway that wakes models on demand",
    ),
    "whatif": (
        "snooze.whatif.cli",
        "replay a request trace through the policy: what each policy costs and holds",
    ),
    "check": (
        "snooze.check.cli",
        "check a cluster, or engines, for what Snooze needs: one line per check, what to fix",
    ),
    "demo": ("snooze.demo.cli", "run the whole system on this machine with a traffic scenario"),
}
# The long-running parts, which log to stderr; they share one set of logging flags. The demo
# logs to a file (its terminal is the live view's) and takes the same level flags.
LOGGING = ("sim", "sandbox", "operator", "gateway")
LEVEL_ONLY = ("demo",)
LEVELS = ("debug", "info", "warning", "error")
# One line per HTTP request (httpx, the sandbox's access log) or per handled watch event
# (kopf's per-object log) drowns what matters: shown with --log-level debug only.
CHATTY = ("httpx", "httpcore", "aiohttp.access", "kopf.objects")


def add_logging_arguments(parser: argparse.ArgumentParser, *, formats: bool = True) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        type=str.lower,
        choices=LEVELS,
        default="info",
        metavar="LEVEL",
        help="debug, info (default), warning or error; debug adds every API and engine request",
    )
    group.add_argument(
        "-v",
        "--verbose",
        dest="log_level",
        action="store_const",
        const="debug",
        help="the same as --log-level debug",
    )
    if not formats:
        return
    group.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text (default): one line per record; json: one JSON object per line, kopf's "
        "format (fields message, severity, timestamp, and the model and pod where known)",
    )


def configure_logging(level: str, log_format: str) -> None:
    """Log to stderr in kopf's formats (so that kopf's own records and ours look alike)."""
    import kopf

    debug = level == "debug"
    # kopf.configure takes a format string as well as its LogFormat (its formatter is built
    # from either): kopf's FULL format cuts logger names to 20 characters.
    text = cast(kopf.LogFormat, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    kopf.configure(
        debug=debug,
        log_prefix=None,  # kopf's records about one object name it, in text
        log_format=kopf.LogFormat.JSON if log_format == "json" else text,
    )
    logging.getLogger().setLevel(level.upper())
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.WARNING)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snooze",
        description="Put idle vLLM models to sleep and wake them on demand.",
    )
    parser.add_argument("--version", action="version", version=f"snooze {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if missing(name):  # listed, not imported: main() says what to install
            subcommands.add_parser(name, help=f"{help_text} (not installed here)")
            continue
        sub = subcommands.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(sub)
        if name in LOGGING or name in LEVEL_ONLY:
            add_logging_arguments(sub, formats=name in LOGGING)
        sub.set_defaults(_module=module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # The first word that is not an option names the subcommand (the top level has no option
    # that takes a value). A part this install lacks gets one line, before any import of it.
    command = next((word for word in words if not word.startswith("-")), None)
    if command is not None and (reason := missing(command)):
        print(reason, file=sys.stderr)
        return 2
    args = build_parser().parse_args(words)
    if args.command in LOGGING:
        configure_logging(args.log_level, args.log_format)
    module = importlib.import_module(args._module)
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
