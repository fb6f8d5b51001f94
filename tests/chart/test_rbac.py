"""The chart's RBAC is exactly what operator/snooze/api/rbac.py declares, each rule with its why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from chart_helpers import CHART, TEMPLATES, load_yaml, manifest_templates, plain_defines

from snooze.api import rbac
from snooze.api.rbac import Permission

# Named rule list in _helpers.tpl -> the declared needs it must equal.
RULE_LISTS: dict[str, tuple[Permission, ...]] = {
    "snooze.rules.operator": rbac.OPERATOR,
    "snooze.rules.gateway": rbac.GATEWAY,
    "snooze.rules.gatewayDiscovery": rbac.GATEWAY_DISCOVERY,
    "snooze.rules.inferenceGateway": rbac.INFERENCE_GATEWAY,
    "snooze.rules.peering.cluster": tuple(
        p for p in rbac.PEERING if p.resource == "clusterkopfpeerings"
    ),
    "snooze.rules.peering.namespaced": tuple(
        p for p in rbac.PEERING if p.resource == "kopfpeerings"
    ),
}

Rule = tuple[str, str, frozenset[str], str]


def _normal(text: str) -> str:
    return " ".join(text.split())


def parse_rules(body: str) -> list[Rule]:
    """Rules of a plain YAML rule list, each with the comment lines just above it."""
    rules: list[Rule] = []
    comment: list[str] = []
    chunks: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("#"):
            comment.append(line.lstrip("# "))
        elif line.startswith("- "):
            chunks.append((line + "\n", comment))
            comment = []
        elif line.strip():
            assert chunks, f"rule text before the first rule: {line!r}"
            chunks[-1] = (chunks[-1][0] + line + "\n", chunks[-1][1])
    for text, why in chunks:
        [rule] = yaml.safe_load(text)
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        assert len(rule["apiGroups"]) == 1 and len(rule["resources"]) == 1, (
            f"one group and one resource per rule, as in rbac.py: {rule}"
        )
        rules.append(
            (
                rule["apiGroups"][0],
                rule["resources"][0],
                frozenset(rule["verbs"]),
                _normal(" ".join(why)),
            )
        )
    return rules


def declared(permissions: tuple[Permission, ...]) -> list[Rule]:
    return [(p.group, p.resource, frozenset(p.verbs), _normal(p.why)) for p in permissions]


@pytest.mark.parametrize("name", sorted(RULE_LISTS))
def test_rule_list_equals_declared_needs(name: str) -> None:
    body = plain_defines().get(name)
    assert body is not None, f"_helpers.tpl has no plain `define {name!r}`"
    assert sorted(parse_rules(body)) == sorted(declared(RULE_LISTS[name]))


def test_peering_lists_cover_every_peering_permission() -> None:
    covered = (
        RULE_LISTS["snooze.rules.peering.cluster"] + RULE_LISTS["snooze.rules.peering.namespaced"]
    )
    assert sorted(covered, key=repr) == sorted(rbac.PEERING, key=repr)


def test_every_rule_says_why() -> None:
    for name in RULE_LISTS:
        for group, resource, _verbs, why in parse_rules(plain_defines()[name]):
            assert why, f"{name}: rule on {group}/{resource} has no comment saying why"


def test_no_wildcards_anywhere_in_rbac() -> None:
    for name in RULE_LISTS:
        for _group, resource, verbs, _why in parse_rules(plain_defines()[name]):
            assert "*" not in resource and "*" not in verbs
    for path in manifest_templates():
        for line in path.read_text().splitlines():
            if re.match(r"\s*(verbs|resources|apiGroups|resourceNames):", line):
                assert "*" not in line, f"{path.name}: {line.strip()}"


def _rule_sections(path: Path) -> list[str]:
    """The text under each `rules:` key, up to the next top-level key or document."""
    sections = re.findall(r"^rules:\n(.*?)(?=^\S|\Z)", path.read_text(), re.MULTILINE | re.DOTALL)
    return sections


@pytest.mark.parametrize(
    ("template", "own", "cluster_only", "namespaced_only"),
    [
        (
            "rbac-operator.yaml",
            "snooze.rules.operator",
            "snooze.rules.peering.cluster",
            "snooze.rules.peering.namespaced",
        ),
        ("rbac-gateway.yaml", "snooze.rules.gateway", None, None),
    ],
)
def test_roles_are_built_only_from_the_rule_lists(
    template: str, own: str, cluster_only: str | None, namespaced_only: str | None
) -> None:
    """Both a ClusterRole (whole cluster) and Roles (watchNamespaces), each made of includes
    of the checked lists and nothing else; peering rules only when peering is on."""
    text = (TEMPLATES / template).read_text()
    sections = _rule_sections(TEMPLATES / template)
    if own == "snooze.rules.operator":
        # The third: a Role in the release's namespace, for the gateway's EndpointSlices.
        *sections, discovery = sections
        assert re.findall(r'include "([^"]+)"', discovery) == ["snooze.rules.gatewayDiscovery"]
    assert len(sections) == 2, f"{template}: one ClusterRole and one Role rule block"
    for section in sections:
        includes = re.findall(r'include "([^"]+)"', section)
        assert includes[0] == own
        stripped = re.sub(r"\{\{-?[^}]*\}\}", "", section)
        assert not stripped.strip(), f"{template}: literal rules outside _helpers.tpl: {stripped}"
    cluster, namespaced = sections
    assert "kind: ClusterRole\n" in text and "kind: Role\n" in text
    if cluster_only and namespaced_only:
        # The Inference Gateway's rules only with inferenceGateway.enabled; peering's with it.
        gated = "snooze.rules.inferenceGateway"
        assert re.findall(r'include "([^"]+)"', cluster) == [own, gated, cluster_only]
        assert re.findall(r'include "([^"]+)"', namespaced) == [own, gated, namespaced_only]
        for section in sections:
            assert re.search(r"if \$peering \}\}\s*\{\{- include \"snooze.rules.peering", section)
            assert re.search(
                r"if \$?\.Values\.inferenceGateway\.enabled \}\}\s*\{\{- include \"" + gated,
                section,
            )
    else:
        assert re.findall(r'include "([^"]+)"', cluster) == [own]
        assert re.findall(r'include "([^"]+)"', namespaced) == [own]
    assert (
        text.index("kind: ClusterRole\n") < text.index("{{- else }}") < text.index("kind: Role\n")
    )
    assert "if not .Values.watchNamespaces" in text
    assert "range $namespace := .Values.watchNamespaces" in text


def test_bindings_name_the_components_service_account() -> None:
    for component in ("operator", "gateway"):
        text = (TEMPLATES / f"rbac-{component}.yaml").read_text()
        accounts = re.findall(r"name: \{\{ \$account \}\}", text)
        assert len(accounts) == 2, "the ClusterRoleBinding and each RoleBinding"
        assert f'include "snooze.{component}.serviceAccountName"' in text


def test_peering_crds_and_objects_match_the_permissions() -> None:
    """The chart ships kopf's peering CRDs and objects for the resources PEERING grants."""
    crds = list(yaml.safe_load_all((CHART / "crds" / "kopfpeerings.kopf.dev.yaml").read_text()))
    served = {(c["spec"]["group"], c["spec"]["names"]["plural"], c["spec"]["scope"]) for c in crds}
    assert served == {
        ("kopf.dev", "clusterkopfpeerings", "Cluster"),
        ("kopf.dev", "kopfpeerings", "Namespaced"),
    }
    assert {(p.group, p.resource) for p in rbac.PEERING} == {(g, r) for g, r, _ in served}
    objects = (TEMPLATES / "peering.yaml").read_text()
    assert "kind: ClusterKopfPeering" in objects and "kind: KopfPeering" in objects
    assert load_yaml(CHART / "values.yaml")["operator"]["peering"]["enabled"] is False
