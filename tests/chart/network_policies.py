"""What a set of NetworkPolicies lets through, as Kubernetes defines it (networking.k8s.io/v1):
the chart's policies are judged by who can reach which port, not by their shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    namespace_labels: dict[str, str] = field(default_factory=dict)

    @property
    def all_namespace_labels(self) -> dict[str, str]:
        """The API server sets kubernetes.io/metadata.name on every namespace."""
        return {**self.namespace_labels, NAME_LABEL: self.namespace}


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector: every matchLabels pair and every matchExpression holds ({} selects all)."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_holds(expression, labels) for expression in selector.get("matchExpressions") or [])


def _holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values")
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    assert operator == "DoesNotExist", operator
    return key not in labels


def _peer_admits(peer: dict[str, Any], policy_namespace: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # the chart makes none; pods' addresses are not modelled here
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], source.all_namespace_labels):
            return False
    elif source.namespace != policy_namespace:
        return False  # a podSelector alone selects pods of the policy's own namespace
    return "podSelector" not in peer or selects(peer["podSelector"], source.labels)


def _rule_admits(rule: dict[str, Any], namespace: str, source: Pod, port: int) -> bool:
    ports = rule.get("ports") or []
    tcp = [p for p in ports if p.get("protocol", "TCP") == "TCP"]
    if ports and not any(p.get("port") in (None, port) for p in tcp):
        return False
    peers = rule.get("from") or []
    return not peers or any(_peer_admits(peer, namespace, source) for peer in peers)


def reaches(policies: list[dict[str, Any]], source: Pod, target: Pod, port: int) -> bool:
    """Whether `source` may open a TCP connection to `target`'s `port` (not from its node)."""
    selecting = [
        policy
        for policy in policies
        if policy["metadata"]["namespace"] == target.namespace
        and "Ingress" in policy["spec"].get("policyTypes", ["Ingress"])
        and selects(policy["spec"]["podSelector"], target.labels)
    ]
    if not selecting:
        return True  # a pod no policy selects takes every connection
    return any(
        _rule_admits(rule, policy["metadata"]["namespace"], source, port)
        for policy in selecting
        for rule in policy["spec"].get("ingress") or []
    )
