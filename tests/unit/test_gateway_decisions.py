"""The gateway's pure decisions: when a wake request stands, which pod gets a request."""

from __future__ import annotations

import pytest
from builders import pod_info

from snooze.gateway.models.hold import known_failure, nothing_to_wake
from snooze.gateway.models.model import Model, model_from
from snooze.gateway.models.wake import wake_pending
from snooze.gateway.request.headers import forward_headers
from snooze.gateway.request.router import Router, pick
from snooze.kube.pods import PodInfo

NOW = 1000.0


@pytest.mark.parametrize(
    ("requested_at", "slept_at", "pending"),
    [
        (None, None, False),  # never asked
        (NOW - 1, None, True),  # asked a moment ago, sleep time unknown
        (NOW - 1, NOW - 10, True),  # asked after the sleep began: that wake is under way
        (NOW - 1, NOW - 0.5, False),  # the pods slept after the request: its wake is over
        (NOW - 3, NOW - 100, True),  # within `recent`, even with a tiny wake timeout
        (NOW - 200, NOW - 300, False),  # older than the wake timeout: ask again
        (NOW - 50, NOW - 300, True),  # within the wake timeout
    ],
)
def test_wake_pending(requested_at: float | None, slept_at: float | None, pending: bool) -> None:
    timeout = 2.0 if requested_at == NOW - 3 else 120.0
    result = wake_pending(
        requested_at=requested_at, slept_at=slept_at, now=NOW, wake_timeout=timeout, recent=5.0
    )
    assert result is pending


def test_pick_prefers_fewest_in_flight() -> None:
    pods = [pod_info("a"), pod_info("b"), pod_info("c")]
    in_flight = {("ns", "a"): 2, ("ns", "b"): 0, ("ns", "c"): 1}
    assert all(pick(pods, in_flight, turn).name == "b" for turn in range(5))  # type: ignore[union-attr]


def test_pick_rotates_among_equally_idle_pods() -> None:
    pods = [pod_info("a"), pod_info("b")]
    assert {pick(pods, {}, turn).name for turn in range(2)} == {"a", "b"}  # type: ignore[union-attr]
    assert pick([], {}, 0) is None


def test_router_counts_requests_in_flight() -> None:
    router = Router()
    a, b = pod_info("a"), pod_info("b")
    with router.track(a):
        assert router.choose([a, b]) == b
        with router.track(b), router.track(b):
            assert router.choose([a, b]) == a
    assert router.in_flight == {}


def test_each_models_pods_take_turns_whatever_other_models_are_sent() -> None:
    # Requests for two models interleaved: each model's own pods still alternate, so that
    # neither of its pods goes without requests (and is slept) while the model is busy.
    router = Router()
    chat = [pod_info("chat-0"), pod_info("chat-1")]
    code = [pod_info("code-0"), pod_info("code-1"), pod_info("code-2")]
    chosen: list[str] = []
    for _ in range(6):
        chosen.append(router.choose(chat, ("ns", "chat")).name)  # type: ignore[union-attr]
        router.choose(code, ("ns", "code"))
    assert chosen == ["chat-0", "chat-1"] * 3
    router.forget(("ns", "chat"))
    assert router.choose(chat, ("ns", "chat")).name == "chat-0"  # type: ignore[union-attr]


def test_hop_by_hop_headers_are_dropped_and_the_rest_pass() -> None:
    headers = {
        "Authorization": "Bearer t",
        "Connection": "keep-alive, X-Private",
        "X-Private": "p",
        "Keep-Alive": "timeout=5",
        "Transfer-Encoding": "chunked",
        "Host": "gateway",
        "Content-Length": "12",
        "Content-Type": "application/json",
    }
    assert dict(forward_headers(headers)) == {
        "Authorization": "Bearer t",
        "Content-Type": "application/json",
    }


def test_router_shuns_an_unreachable_pod_while_others_remain() -> None:
    router = Router()
    a, b = pod_info("a"), pod_info("b")
    router.unreachable(a)
    assert all(router.choose([a, b]) == b for _ in range(4))
    assert router.choose([a]) == a  # nothing better: try it anyway


def failing_model(
    *,
    on_failure: str = "Report",
    since: str | None = "2026-01-01T00:00:10.000Z",
    failed: bool = True,
    entries: dict[str, tuple[str, str, str]] | None = None,
) -> Model:
    """A model whose status reports pods (state, uid, failureReason) and maybe WakeFailed."""
    conditions = []
    if failed:
        conditions.append(
            {"type": "WakeFailed", "status": "True", "reason": "EngineError",
             "message": "p0: boom", "lastTransitionTime": since}
        )  # fmt: skip
    pods = [
        {"name": name, "state": state, "uid": uid, "failureReason": reason}
        for name, (state, uid, reason) in (entries or {}).items()
    ]
    return model_from(
        {
            "metadata": {"namespace": "ns", "name": "m"},
            "spec": {"selector": {"matchLabels": {"app": "m"}}, "wake": {"onFailure": on_failure}},
            "status": {"modelName": "m", "pods": pods, "conditions": conditions},
        }
    )


def labelled(name: str, state: str, *, ready: bool = True) -> PodInfo:
    return pod_info(name, state=state, ready=ready)


T9 = 1767225609.0  # 2026-01-01T00:00:09Z: a wake request a second before the failure
T11 = T9 + 2.0  # a wake request a second after it
FAILED = {"p0": ("failed", "p0", "EngineError")}
HYBRID = {"p0": ("failed", "p0", "HybridKVCacheReinit")}


@pytest.mark.parametrize(
    ("model", "pods", "asked_at", "known"),
    [
        (failing_model(entries=FAILED), [labelled("p0", "failed")], T9, True),
        # The failure is older than the wake request: the operator tries again (Report).
        (failing_model(entries=FAILED), [labelled("p0", "failed")], T11, False),
        # ...but never after the hybrid crash.
        (failing_model(entries=HYBRID), [labelled("p0", "failed")], T11, True),
        # The label alone, or the status entry alone, says failed.
        (failing_model(entries={}), [labelled("p0", "failed")], T9, True),
        (failing_model(entries=FAILED), [labelled("p0", "asleep")], T9, True),
        # A status entry about another pod of the same name does not count.
        (
            failing_model(entries={"p0": ("failed", "old", "")}),
            [labelled("p0", "asleep")],
            T9,
            False,
        ),
        # A restart may yet serve; a pod not failed may yet wake; no condition, no failure.
        (
            failing_model(on_failure="Restart", entries=FAILED),
            [labelled("p0", "failed")],
            T9,
            False,
        ),
        (
            failing_model(entries=FAILED),
            [labelled("p0", "failed"), labelled("p1", "waking")],
            T9,
            False,
        ),
        (failing_model(failed=False, entries=FAILED), [labelled("p0", "failed")], T9, False),
        (failing_model(entries=FAILED), [labelled("p0", "failed", ready=False)], T9, False),
        (failing_model(entries=FAILED), [labelled("p0", "failed")], None, False),
    ],
)
def test_known_failure(
    model: Model, pods: list[PodInfo], asked_at: float | None, known: bool
) -> None:
    failure = known_failure(model, pods, asked_at=asked_at)
    assert (failure is not None) is known
    if failure is not None:
        assert (failure.reason, failure.message) == ("EngineError", "p0: boom")


@pytest.mark.parametrize("outcome", ["timeout", "failed"])
def test_a_failed_wait_says_which_kubectl_command_shows_why(outcome: str) -> None:
    """`kubectl describe im NAME -n NS` (`inferencemodel` alone is ambiguous where the Gateway
    API Inference Extension is installed); the namespace only with --expose-model-status."""
    from snooze.gateway.models.hold import Outcome, Waited
    from snooze.gateway.request.inference import _failure

    model = model_from(
        {
            "metadata": {"namespace": "team-a", "name": "chat-im"},
            "spec": {"modelName": "chat", "selector": {"matchLabels": {"app": "m"}}},
            "status": {"modelName": "chat"},
        }
    )
    waited = (
        Waited(outcome=Outcome.TIMEOUT)
        if outcome == "timeout"
        else Waited(outcome=Outcome.FAILED, failure=failing_model().wake_failure)
    )
    assert outcome == "timeout" or waited.failure is not None
    _, named, _ = _failure(model, waited, 1, name_it=True)
    assert "`kubectl describe im chat-im -n team-a`" in named
    _, anonymous, _ = _failure(model, waited, 1, name_it=False)
    assert "`kubectl describe im` in the model's namespace" in anonymous
    assert "team-a" not in anonymous and "chat-im" not in anonymous
    assert "inferencemodel " not in named + anonymous


def without_pods(
    *, reason: str = "NoPods", observed: int | None = 3, generation: int = 3, **spec: object
) -> Model:
    """A model whose Ready condition is False with `reason`, computed from generation
    `observed` of its spec."""
    ready = {
        "type": "Ready", "status": "False", "reason": reason, "message": "none",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": observed,
    }  # fmt: skip
    return model_from(
        {
            "metadata": {"namespace": "ns", "name": "m", "generation": generation},
            "spec": {"selector": {"matchLabels": {"app": "m"}}, **spec},
            "status": {"modelName": "m", "conditions": [ready]},
        }
    )


@pytest.mark.parametrize(
    ("model", "pods", "answered"),
    [
        (without_pods(), [], True),
        # A pod the status does not know yet (starting, or come since): waited for.
        (without_pods(), [labelled("p0", "asleep", ready=False)], False),
        # A workload that a wake scales up from zero: woken.
        (without_pods(scaleTargetRef={"kind": "Deployment", "name": "m"}), [], False),
        # Said of an older spec (its selector has changed since), or of no known spec.
        (without_pods(observed=2), [], False),
        (without_pods(observed=None), [], False),
        # Pods selected, none Ready yet: they may yet serve.
        (without_pods(reason="NoEngines"), [], False),
    ],
)
def test_nothing_to_wake_only_when_nothing_will_come(
    model: Model, pods: list[PodInfo], answered: bool
) -> None:
    assert nothing_to_wake(model, pods, coming_back=0.0) is answered
    # A pod gone so lately that its controller may be recreating it: waited for.
    assert not nothing_to_wake(model, pods, coming_back=0.5)


def test_no_engines_says_what_shows_the_pods() -> None:
    """The selector, quoted for a shell, and the namespace only with --expose-model-status."""
    from snooze.gateway.request.inference import no_engines

    model = without_pods(
        selector={"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}
    )
    named = no_engines(model, name_it=True)
    assert "(NoPods)" in named and "scaleTargetRef" in named
    assert "`kubectl get pods -l 'tier in (a,b)' -n ns`" in named
    anonymous = no_engines(model, name_it=False)
    assert "`kubectl describe im` in the model's namespace" in anonymous
    assert "tier" not in anonymous and " ns" not in anonymous
