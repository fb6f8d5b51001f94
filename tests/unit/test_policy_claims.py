"""Who holds a model name claimed twice, which pods are shared, which workload a model owns."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from snooze.api.models import LabelSelector
from snooze.policy.claims import Claim, holder, shared_pods, workload_problem


def claim(ns: str, name: str, created: str, *, holds: bool = False) -> Claim:
    return Claim(namespace=ns, name=name, created=created, holds=holds)


def test_nobody_claims_nothing() -> None:
    assert holder([]) is None


def test_the_oldest_new_claim_wins_then_namespace_and_name() -> None:
    a = claim("b", "m", "2026-01-01T00:00:00Z")
    b = claim("a", "m", "2026-01-02T00:00:00Z")
    c = claim("a", "m", "2026-01-01T00:00:00Z")
    assert holder([a, b]) == a
    assert holder([a, b, c]) == c  # same time: namespace a before b


def test_a_holder_keeps_its_name_against_an_older_model() -> None:
    older = claim("x", "renamed-onto-it", "2025-01-01T00:00:00Z")
    held = claim("y", "held", "2026-01-01T00:00:00Z", holds=True)
    assert holder([older, held]) == held


CLAIMS = st.lists(
    st.builds(
        Claim,
        namespace=st.sampled_from(["a", "b", "c"]),
        name=st.sampled_from(["m", "n"]),
        created=st.sampled_from(["2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"]),
        holds=st.booleans(),
    ),
    unique_by=lambda c: (c.namespace, c.name),
    min_size=1,
)


@given(CLAIMS, st.randoms())
def test_every_reader_agrees_whatever_the_order(claims: list[Claim], rnd: object) -> None:
    shuffled = list(claims)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert holder(claims) == holder(shuffled)


@given(CLAIMS)
def test_a_claim_that_holds_is_never_displaced_by_one_that_does_not(claims: list[Claim]) -> None:
    chosen = holder(claims)
    assert chosen is not None
    if any(c.holds for c in claims):
        assert chosen.holds


def test_shared_pods_name_the_other_models() -> None:
    pods = {"p0": {"app": "x", "team": "y"}, "p1": {"app": "x"}}
    others = [("by-team", LabelSelector(match_labels={"team": "y"}))]
    assert shared_pods(pods, others) == {"p0": ["by-team"]}
    assert shared_pods(pods, []) == {}


def test_a_workload_is_owned_when_the_selector_selects_its_pods() -> None:
    selector = LabelSelector(match_labels={"app": "chat"})
    assert (
        workload_problem(selector, kind="Deployment", name="chat", template_labels={"app": "chat"})
        is None
    )
    problem = workload_problem(
        selector, kind="Deployment", name="payments-api", template_labels={"app": "payments"}
    )
    assert problem is not None
    assert problem.startswith("spec.scaleTargetRef:")
    assert "payments-api" in problem and "app=payments" in problem
