"""The --kubeconfig and --context flags of a command that logs in to the Kubernetes API (found
then as credentials.find says); light, so that `snooze --help` loads no client."""

from __future__ import annotations

import argparse


def add_credential_arguments(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="the kubeconfig to use (default: KUBECONFIG, else the pod's service account, "
        "else ~/.kube/config)",
    )
    parser.add_argument(
        "--context", metavar="NAME", help="the kubeconfig context to use (default: its current)"
    )
