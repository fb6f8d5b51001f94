"""The `snooze` command: one entry point, a subcommand per part, each imported only when run."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from snooze import __version__

# Subcommand -> (module, one-line help). Each module offers `add_arguments(parser)` and
# `run(args) -> int`, and imports its heavy parts (kopf, aiohttp) inside `run`, so that
# `snooze crd` does not pay for the operator.
COMMANDS: dict[str, tuple[str, str]] = {
    "crd": ("snooze.crd", "print the InferenceModel CustomResourceDefinition as YAML"),
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
    "demo": ("snooze.demo.cli", "run the whole system on this machine with a traffic scenario"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snooze",
        description="Put idle vLLM models to sleep and wake them on demand.",
    )
    parser.add_argument("--version", action="version", version=f"snooze {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subcommands.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(sub)
        sub.set_defaults(_module=module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(args._module)
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
