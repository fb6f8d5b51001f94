"""When to probe an engine: when a decision depends on what it would say, not by the clock.

A probe is an HTTP request to the engine; at thousands of engines they are most of what the
operator costs. Most of the time nothing depends on one:
- an engine asleep changes only when Snooze wakes it;
- an engine whose requests come through the gateway is known to be active from the
  gateway's own counters, so it need not be asked until its idle deadline comes near.
An engine is probed when a decision may depend on it: its idle deadline is within one probe
interval (so that a sleep is always decided on a probe at most one interval old, which also
catches traffic that bypassed the gateway), its label and its last answer disagree or are
left over from a step in flight, its last probe got no answer, it has served requests
the gateway does not account for (traffic straight to the engine, whose end only probes
can time), a gateway found it stuck since its last probe (requests waited on it and it
started no answer), or it is an awake GPU pool member that no gateway counters follow (the pool
chooses whom to put to sleep by their latest activity, at any moment). Everything else is
probed at the slow drift interval, to notice what nobody told the operator. `interval` is
thus the longest an engine goes unobserved while a decision could depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from snooze.api.models import EngineState


@dataclass(frozen=True, kw_only=True)
class ProbeFacts:
    """What the operator knows of one engine between probes."""

    last_probe: float | None
    """When it was last probed; None: never."""
    answered: bool
    """Its last probe got an answer."""
    sleeping: bool | None
    """What it last said: asleep or awake."""
    label: EngineState | None
    """Its published state."""
    direct_activity: bool
    """At its last probe it was serving, or had finished, requests that the gateway's counters
    do not account for (traffic straight to the engine)."""
    last_activity: float
    """Its latest known activity: probes and the gateway's counters together."""
    followed: bool = False
    """Its activity matters at every moment, not only near its idle deadline (a GPU pool
    member: the pool orders its evictions by it and spares the busy), and no gateway counters
    tell it: it is probed every interval."""
    stalled: bool = False
    """A gateway found it stuck since its last probe: requests waited on it and it started
    no answer, so its counters say nothing of whether it is awake."""


def probe_due(
    facts: ProbeFacts, *, idle_after: float, now: float, interval: float, drift: float
) -> bool:
    """Pure: whether to probe the engine now (see the module's docstring)."""
    if facts.last_probe is None or not facts.answered or facts.sleeping is None:
        return True
    since = now - facts.last_probe
    if since >= drift:
        return True
    if facts.label not in (EngineState.AWAKE, EngineState.ASLEEP, EngineState.FAILED):
        return True  # no label yet, or a draining/waking label: a step to settle
    if (facts.label is EngineState.AWAKE) == facts.sleeping:
        return True  # the label says one thing, the engine the other
    if facts.stalled:
        return True  # it may sleep behind its label, or not answer at all: ask it
    if facts.sleeping or since < interval:
        return False
    if facts.direct_activity or facts.followed:
        return True  # only probes can time the end of traffic that bypasses the gateway
    return facts.last_activity + idle_after - now <= interval


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """One engine's requests through the gateway (all its replicas), as last scraped."""

    sent: float
    """Requests sent to it and ended, so far."""
    in_flight: int
    """Requests on their way to it or being answered now."""
    last: float | None
    """When the last of them ended."""
    at: float
    """When the scrape that saw these began (the counters are at least this recent)."""
    stalls: float = 0.0
    """Times it was found stuck: it started no answer while requests waited on it."""


@dataclass(frozen=True, kw_only=True)
class Pending:
    """A probe's count of finished requests, waiting for a scrape of the gateway taken after it."""

    engine_total: float
    probed_at: float
    gateway_sent: float
    """What the gateway had sent by a scrape taken before the probe."""


@dataclass(frozen=True, kw_only=True)
class Ledger:
    """An engine's finished requests against those the gateway sent it.

    The engine is probed and the gateway scraped at different moments, so the two counters
    are compared only over spans the gateway's covers whole: from a scrape before one probe
    to a scrape after the next. Requests that ended in between are then counted on both
    sides, and only requests the gateway never sent can make the engine's side larger.
    """

    engine_total: float
    gateway_sent: float
    """The gateway's count at a scrape before the probe that counted `engine_total`."""
    pending: Pending | None = None


@dataclass(frozen=True, kw_only=True)
class Seen:
    """An engine's activity from its probe and the gateway's counters together."""

    busy: bool
    direct_activity: bool
    last_activity: float
    ledger: Ledger | None


@dataclass(frozen=True, kw_only=True)
class Probed:
    """What this cycle's probe of an engine said of its requests."""

    in_flight: int
    total: float | None
    """Its success counter (requests finished), None if it publishes none."""
    at: float
    """When its answer came (the counts are no older than this)."""


def seen(
    *,
    now: float,
    last_activity: float,
    probe: Probed | None,
    previous_total: float | None,
    traffic: Traffic | None,
    ledger: Ledger | None,
    direct_before: bool,
) -> Seen:
    """Pure: what an engine has been doing, from this cycle's probe (None: not probed), its
    previous success count, and the gateway's counters (None: unknown).

    For the sleep decision, any request the engine ran or finished that the gateway's last
    scrape does not account for counts as activity now: an engine is never slept on a probe
    that saw it serve. Activity the gateway accounts for is dated by the gateway (the end of
    its last request). Whether that activity was traffic straight to the engine, which only
    probes can follow (so it is probed every interval), is judged by the ledger once a scrape
    covers the probe: more requests finished than the gateway sent over the same span.
    """
    finished = (
        0.0
        if probe is None or probe.total is None or previous_total is None
        else max(probe.total - previous_total, 0.0)
    )
    if traffic is None:
        if probe is None:
            return Seen(
                busy=direct_before,
                direct_activity=direct_before,
                last_activity=last_activity,
                ledger=None,
            )
        active = bool(probe.in_flight) or bool(finished)
        return Seen(
            busy=bool(probe.in_flight),
            direct_activity=active,
            last_activity=now if active else last_activity,
            ledger=None,
        )

    # Never later than now: a gateway replica whose clock runs ahead must not delay sleeps.
    latest = max(last_activity, min(traffic.last or last_activity, now))
    busy = traffic.in_flight > 0
    if traffic.in_flight > 0:
        latest = now
    if probe is not None:
        busy = busy or probe.in_flight > 0
        if ledger is not None and probe.total is not None:
            finished = probe.total - ledger.engine_total
            explained = traffic.sent - ledger.gateway_sent + traffic.in_flight
        else:
            explained = 0
        if probe.in_flight > traffic.in_flight or finished > explained:
            latest = now  # not (yet) accounted for by the gateway: activity now, to be safe

    direct = direct_before
    ledger, judged = _account(ledger, probe, traffic)
    if judged is not None:
        direct = judged
    return Seen(busy=busy, direct_activity=direct, last_activity=latest, ledger=ledger)


def _account(
    ledger: Ledger | None, probe: Probed | None, traffic: Traffic
) -> tuple[Ledger | None, bool | None]:
    """The ledger after this cycle, and its judgment if a pending probe could be judged:
    True if the engine finished requests the gateway did not send."""
    judged: bool | None = None
    if ledger is not None and ledger.pending is not None and traffic.at > ledger.pending.probed_at:
        pending = ledger.pending
        finished = pending.engine_total - ledger.engine_total
        sent = traffic.sent - ledger.gateway_sent
        if finished < 0 or sent < 0:
            ledger = None  # a counter went back (an engine or a gateway restarted): start over
        else:
            judged = finished > sent + traffic.in_flight
            ledger = Ledger(engine_total=pending.engine_total, gateway_sent=pending.gateway_sent)
    if probe is None or probe.total is None or traffic.at > probe.at:
        return ledger, judged
    if ledger is None:
        # The scrape came before this probe: a baseline for the span to the next probe.
        return Ledger(engine_total=probe.total, gateway_sent=traffic.sent), judged
    if ledger.pending is None:
        pending = Pending(engine_total=probe.total, probed_at=probe.at, gateway_sent=traffic.sent)
        return Ledger(
            engine_total=ledger.engine_total, gateway_sent=ledger.gateway_sent, pending=pending
        ), judged
    return ledger, judged
