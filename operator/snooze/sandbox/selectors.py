"""Label and field selectors as the API server parses and applies them, as pure functions."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A selector that the API server would refuse with 400 Bad Request."""


@dataclass(frozen=True, kw_only=True)
class Requirement:
    """One term of a label selector: `key op values` (values empty for exists/!key)."""

    key: str
    op: str  # one of: =, !=, in, notin, exists, !
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether the labels satisfy this term; pure."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # `!=` and `notin` match objects without the label too, as the API server does.
        return not present or value not in self.values


# Terms are separated by commas outside of parentheses: `a in (x,y),b!=z`.
_SPLIT = re.compile(r",(?![^(]*\))")
_SET_TERM = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(?P<neg>!)?\s*(?P<key>[^\s!=(),]+)\s*$")


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """Parse `labelSelector` (=, ==, !=, in, notin, key, !key); pure; raises SelectorError."""
    requirements: list[Requirement] = []
    for term in _SPLIT.split(text):
        if not term.strip():
            continue
        if match := _SET_TERM.match(term):
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            requirements.append(Requirement(key=match["key"], op=match["op"], values=values))
        elif match := _EQ_TERM.match(term):
            op = "!=" if match["op"] == "!=" else "="
            values = frozenset({match["value"]})
            requirements.append(Requirement(key=match["key"], op=op, values=values))
        elif match := _EXISTS_TERM.match(term):
            op = "!" if match["neg"] else "exists"
            requirements.append(Requirement(key=match["key"], op=op))
        else:
            raise SelectorError(f"unable to parse requirement: {term.strip()!r}")
    return tuple(requirements)


def parse_field_selector(text: str) -> tuple[tuple[str, str, str], ...]:
    """Parse `fieldSelector` into (field, op, value) terms with op `=` or `!=`; pure."""
    terms: list[tuple[str, str, str]] = []
    for term in text.split(","):
        if not term.strip():
            continue
        match = re.match(r"^\s*([^\s!=]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if match is None:
            raise SelectorError(f"invalid field selector term: {term.strip()!r}")
        field, op, value = match.groups()
        terms.append((field, "!=" if op == "!=" else "=", value))
    return tuple(terms)


def _field_value(obj: Mapping[str, Any], field: str) -> str | None:
    node: Any = obj
    for part in field.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return None if node is None else str(node)


# The API server allows per resource only a few fields; these work for every resource.
_COMMON_FIELDS = {"metadata.name", "metadata.namespace"}
# Fields that the API server indexes for some built-in kinds and that clients use.
_KIND_FIELDS: dict[str, set[str]] = {
    "Pod": {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    "Event": {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
    "Namespace": {"status.phase"},
    "Secret": {"type"},
}


def check_field_selector(terms: tuple[tuple[str, str, str], ...], *, kind: str) -> None:
    """Refuse fields that the API server does not support for this kind, as it does (400)."""
    allowed = _COMMON_FIELDS | _KIND_FIELDS.get(kind, set())
    for field, _, _ in terms:
        if field not in allowed:
            raise SelectorError(f'field label not supported: "{field}"')


def compile_selectors(
    *, label_selector: str, field_selector: str, kind: str
) -> Callable[[Mapping[str, Any]], bool]:
    """Build one predicate over raw objects from both selectors; raises SelectorError."""
    requirements = parse_label_selector(label_selector)
    fields = parse_field_selector(field_selector)
    check_field_selector(fields, kind=kind)

    def predicate(obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        if not all(req.matches(labels) for req in requirements):
            return False
        for field, op, value in fields:
            # The API server compares a missing field as the empty string.
            actual = _field_value(obj, field) or ""
            if (actual == value) != (op == "="):
                return False
        return True

    return predicate


def format_label_selector(selector: Mapping[str, Any]) -> str:
    """Render a LabelSelector object (matchLabels, matchExpressions) as a query string; pure."""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "Exists":
            terms.append(key)
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
        else:
            terms.append(f"{key} {op.lower()} ({','.join(values)})")
    return ",".join(terms)
