"""The alert rules pass `promtool check rules`, and each has `promtool test rules` unit tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from chart_helpers import CHART, load_yaml
from rendering import render

RULES = CHART / "rules" / "snooze.rules.yaml"
RULE_TESTS = sorted((CHART / "rules" / "tests").glob("*.yaml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.needs("promtool")
# What each alert is for; a new rule must be added here, and so be thought about.
ALERTS = {
    "SnoozeWakeFailures",
    "SnoozeWakeVerificationFailed",
    "SnoozeWakeLatencyHigh",
    "SnoozeHeldRequestsTimingOut",
    "SnoozeModelStuckWaking",
    "SnoozeModelStuckDraining",
    "SnoozePoolWakesOutOfMemory",
    "SnoozePoolOvercommitted",
    "SnoozePoolWaitsForRoom",
    "SnoozeOperatorDown",
    "SnoozeGatewayDown",
}


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def promtool(*args: str | Path) -> str:
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


@needs_promtool
def test_promtool_check_rules() -> None:
    assert f"SUCCESS: {len(rules())} rules found" in promtool("check", "rules", RULES)


@needs_promtool
@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda p: p.stem)
def test_promtool_test_rules(path: Path) -> None:
    assert "SUCCESS" in promtool("test", "rules", path)


def test_the_alerts_are_the_issue_s_and_each_is_labelled_and_explained() -> None:
    assert {rule["alert"] for rule in rules()} == ALERTS
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert set(rule["annotations"]) == {"summary", "description"}, name
        if "snooze_pool_" in rule["expr"]:
            assert "$labels.pool" in rule["annotations"]["description"], name
        elif "absent(" not in rule["expr"]:
            # absent() carries no labels: only per-model alerts can name the model.
            assert "$labels.model" in rule["annotations"]["description"], name


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        document = load_yaml(path)
        assert document["rule_files"] == ["../snooze.rules.yaml"], path.name
        for test in document["tests"]:
            for case in test["alert_rule_test"]:
                (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    assert firing == ALERTS and quiet == ALERTS


@pytest.mark.parametrize(
    "release", ["prod", "snooze", "snooze-canary", "x" * 53, "team-" + "s" * 38 + "-snooze"]
)
def test_the_down_alerts_match_the_chart_s_job_names(release: str) -> None:
    """The ServiceMonitor names a job after its Service (FULLNAME-COMPONENT-metrics), whatever
    the release's name; Prometheus anchors the alerts' regexes at both ends."""
    monitored = {
        "serviceMonitor": {"enabled": True},
        "networkPolicy": {"scraper": {"namespace": "monitoring"}},
    }
    rendering = render(monitored, release=release)
    exprs = {rule["alert"]: rule["expr"] for rule in rules()}
    for alert, component, other in [
        ("SnoozeOperatorDown", "operator", "gateway"),
        ("SnoozeGatewayDown", "gateway", "operator"),
    ]:
        [pattern] = re.findall(r'job=~"([^"]+)"', exprs[alert])
        job = rendering.one("Service", f"-{component}-metrics")["metadata"]["name"]
        assert re.fullmatch(pattern, job), (alert, job)
        other_job = rendering.one("Service", f"-{other}-metrics")["metadata"]["name"]
        assert not re.fullmatch(pattern, other_job), (alert, other_job)


def anchors(markdown: str) -> set[str]:
    """The fragment of each heading, as GitHub makes it (lowercase, punctuation dropped,
    spaces to hyphens)."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_each_alert_has_its_runbook_in_the_docs() -> None:
    """Each alert's section in the docs (docs/alerts.md, a page of the docs site) says what it
    means and what to do; no address serves that page by default, so the rules name none."""
    page = (CHART.parents[1] / "docs" / "alerts.md").read_text()
    for rule in rules():
        assert "runbook_url" not in rule["annotations"], rule["alert"]
        assert rule["alert"].lower() in anchors(page), f"no heading for {rule['alert']}"
        section = page.split(f"## {rule['alert']}\n", 1)[1].split("\n## ", 1)[0]
        assert "What to do" in section and len(section.split()) > 40, rule["alert"]


def test_the_runbook_address_follows_the_value() -> None:
    """`runbook_url`, as Prometheus' conventions name it: where the operator's people read
    docs/alerts.md, plus the alert's section; without the value, the rules as written."""
    values = {
        "prometheusRule": {"enabled": True, "runbookBaseURL": "https://docs.snooze.test/alerts"}
    }
    rendered = render(values).one("PrometheusRule")
    alerts = [r for g in rendered["spec"]["groups"] for r in g["rules"] if "alert" in r]
    urls = [rule["annotations"]["runbook_url"] for rule in alerts]
    assert urls == [f"https://docs.snooze.test/alerts#{rule['alert'].lower()}" for rule in rules()]
    # The rest of each rule is the file's, word for word.
    for rule in alerts:
        del rule["annotations"]["runbook_url"]
    assert alerts == rules()
    default = render({"prometheusRule": {"enabled": True}}).one("PrometheusRule")
    assert default["spec"]["groups"] == load_yaml(RULES)["groups"]


def described_commands() -> list[tuple[str, dict[str, str]]]:
    """Each kubectl command in an alert's description as the rule tests expect it rendered,
    with the alert's labels."""
    found = []
    for path in RULE_TESTS:
        for test in load_yaml(path)["tests"]:
            for case in test["alert_rule_test"]:
                for alert in case["exp_alerts"]:
                    description = alert["exp_annotations"]["description"]
                    for command in re.findall(r"`(kubectl [^`]+)`", description):
                        found.append((command, alert["exp_labels"]))
    return found


@pytest.mark.needs("kubectl")
def test_the_commands_alerts_give_work_as_rendered(tmp_path: Path) -> None:
    import os
    import shlex

    import httpx

    from snooze.sandbox import Sandbox

    commands = described_commands()
    assert {c for c, _ in commands} == {"kubectl describe im chat -n default"}
    # wake failures (2), failed verifications (2), held timeouts, stuck waking, stuck draining
    assert len(commands) == 7
    crd = load_yaml(CHART.parents[1] / "crds" / "inferencemodels.snooze.dev.yaml")
    with Sandbox() as sandbox:
        kubeconfig = sandbox.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBECACHEDIR": str(tmp_path)}
        api = sandbox.url + "/apis"
        httpx.post(f"{api}/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
        for namespace, model in {(labels["namespace"], labels["model"]) for _, labels in commands}:
            created = httpx.post(
                f"{api}/snooze.dev/v1alpha1/namespaces/{namespace}/inferencemodels",
                json={
                    "apiVersion": "snooze.dev/v1alpha1",
                    "kind": "InferenceModel",
                    "metadata": {"name": model, "namespace": namespace},
                    "spec": {"selector": {"matchLabels": {"app": model}}},
                },
            )
            created.raise_for_status()
        for command, labels in commands:
            shown = subprocess.run(
                shlex.split(command), env=env, capture_output=True, text=True, timeout=60
            )
            assert shown.returncode == 0, f"{command}: {shown.stderr}"
            assert re.search(rf"Name:\s+{labels['model']}\n", shown.stdout), shown.stdout
