"""JSON patch (RFC 6902) and JSON merge patch (RFC 7386) over plain dicts, as pure functions."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


class PatchError(ValueError):
    """A patch that cannot be applied; the API server answers 422 for these."""


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch and return a new value; `null` removes a key; pure."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"invalid JSON pointer: {pointer!r}")
    return [_unescape(token) for token in pointer[1:].split("/")]


def _resolve(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise PatchError(f"path not found: /{'/'.join(tokens)}")
    return node


def _add(doc: Any, tokens: list[str], value: Any, *, replace: bool) -> Any:
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"replace: missing key at /{'/'.join(tokens)}")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise PatchError(f"index out of range at /{'/'.join(tokens)}")
    else:
        raise PatchError(f"cannot add into a scalar at /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _resolve(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(f"remove: path not found: /{'/'.join(tokens)}")


def json_patch(document: Any, operations: Any) -> Any:
    """Apply RFC 6902 operations to a copy of the document; raises PatchError; pure."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(document)
    for operation in operations:
        if not isinstance(operation, Mapping) or "op" not in operation:
            raise PatchError(f"invalid operation: {operation!r}")
        op = operation["op"]
        tokens = _split(str(operation.get("path", "")))
        if op == "test":
            actual = _resolve(doc, tokens)
            if actual != operation.get("value"):
                # The same wording as the API server's JSON patch library, for familiar logs.
                raise PatchError(
                    f"testing value /{'/'.join(tokens)} failed: test failed"
                    f" (expected {operation.get('value')!r}, found {actual!r})"
                )
        elif op in ("add", "replace"):
            doc = _add(doc, tokens, copy.deepcopy(operation.get("value")), replace=op == "replace")
        elif op == "remove":
            _remove(doc, tokens)
        elif op in ("move", "copy"):
            source = _split(str(operation.get("from", "")))
            value = _remove(doc, source) if op == "move" else copy.deepcopy(_resolve(doc, source))
            doc = _add(doc, tokens, value, replace=False)
        else:
            raise PatchError(f"unsupported operation: {op!r}")
    return doc
