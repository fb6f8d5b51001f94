"""`python -m snooze_vllm_patch check`: the same check as the `snooze-vllm-check` command."""

from __future__ import annotations

import sys

from snooze_vllm_patch.check import main

USAGE = "usage: python -m snooze_vllm_patch check"

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "check":
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(args[1:]))
