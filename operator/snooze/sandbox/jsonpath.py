"""The JSONPath subset that CRD printer columns use: fields, indexes, `*`, `?(@.a=="b")`."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

# One step of a path: `.field`, `['field']`, `[0]`, `[*]`, `.*` or `[?(@.a.b=="value")]`.
_STEP = re.compile(
    r"""\.(?P<field>[A-Za-z0-9_$-]+|\*)
    |\[\s*'(?P<quoted>[^']*)'\s*\]
    |\[\s*(?P<index>-?\d+)\s*\]
    |\[\s*(?P<all>\*)\s*\]
    |\[\s*\?\(\s*@(?P<left>(?:\.[A-Za-z0-9_$-]+)+)\s*(?P<op>==|!=)\s*
        (?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<num>-?\d+(?:\.\d+)?)|(?P<bool>true|false))\s*\)\s*\]
    """,
    re.VERBOSE,
)

Step = tuple[str, Any]


class JSONPathError(ValueError):
    """A path outside the subset that the sandbox evaluates."""


def parse(path: str) -> tuple[Step, ...]:
    """The steps of a path such as `.status.conditions[?(@.type=="Ready")].status`; pure."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    text = text.removeprefix("$")
    steps: list[Step] = []
    pos = 0
    while pos < len(text):
        match = _STEP.match(text, pos)
        if match is None:
            raise JSONPathError(f"unsupported JSONPath {path!r} at {text[pos:]!r}")
        pos = match.end()
        if match["field"] == "*" or match["all"]:
            steps.append(("all", None))
        elif match["field"] is not None or match["quoted"] is not None:
            steps.append(
                ("field", match["field"] if match["field"] is not None else match["quoted"])
            )
        elif match["index"] is not None:
            steps.append(("index", int(match["index"])))
        else:
            steps.append(
                ("filter", (match["left"].strip(".").split("."), match["op"], _literal(match)))
            )
    return tuple(steps)


def _literal(match: re.Match[str]) -> Any:
    if match["dq"] is not None:
        return match["dq"]
    if match["sq"] is not None:
        return match["sq"]
    if match["bool"] is not None:
        return match["bool"] == "true"
    number = match["num"]
    return float(number) if "." in number else int(number)


def find(obj: Any, steps: tuple[Step, ...]) -> list[Any]:
    """Every value that the steps reach in `obj`; missing keys give no values, as with kubectl."""
    nodes = [obj]
    for kind, arg in steps:
        nodes = [found for node in nodes for found in _apply(node, kind, arg)]
    return nodes


def _apply(node: Any, kind: str, arg: Any) -> Iterator[Any]:
    if kind == "field":
        if isinstance(node, Mapping) and arg in node:
            yield node[arg]
    elif kind == "index":
        if isinstance(node, list) and -len(node) <= arg < len(node):
            yield node[arg]
    elif kind == "all":
        yield from (
            node.values() if isinstance(node, Mapping) else node if isinstance(node, list) else ()
        )
    elif kind == "filter" and isinstance(node, list):
        keys, op, value = arg
        for item in node:
            found = find(item, tuple(("field", key) for key in keys))
            if found and (found[0] == value) == (op == "=="):
                yield item
