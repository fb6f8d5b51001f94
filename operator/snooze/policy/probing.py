"""When to probe an engine: when a decision depends on what it would say, not by the clock.

A probe is an HTTP request to the engine; at thousands of engines they are most of what the
operator costs. Most of the time nothing depends on one:
- an engine asleep changes only when Snooze wakes it;
- an engine whose requests come through the gateway is known to be active from the
  gateway's own counters, so it need not be asked until its idle deadline comes near.
An engine is probed when a decision may depend on it: its idle deadline is within one probe
interval (so that a sleep is always decided on a probe at most one interval old, which also
catches traffic that bypassed the gateway), its label and its last answer disagree or are
left over from a step in flight, its last probe got no answer, or it has served requests
the gateway does not account for (traffic straight to the engine, whose end only probes
can time). Everything else is probed at the slow drift interval, to notice what nobody told
the operator. `interval` is thus the longest an engine goes unobserved while a decision
could depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from snooze.models import EngineState


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
    if facts.sleeping or since < interval:
        return False
    if facts.direct_activity:
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


@dataclass(frozen=True, kw_only=True)
class Seen:
    """An engine's activity from its probe and the gateway's counters together."""

    busy: bool
    direct_activity: bool
    last_activity: float


def seen(
    *,
    now: float,
    last_activity: float,
    probe_in_flight: int | None,
    probe_finished: float | None,
    traffic: Traffic | None,
    traffic_sent_since: float | None,
    direct_before: bool,
) -> Seen:
    """Pure: what an engine has been doing, from this cycle's probe (None: not probed) and the
    gateway's counters (None: unknown).

    `probe_finished` is how many requests the engine finished since its previous probe, and
    `traffic_sent_since` how many the gateway sent it and saw end over the same span. Activity
    the gateway accounts for is dated by the gateway (the end of its last request); activity
    it does not (more requests in the engine than the gateway has in flight, or more finished
    than it sent) is traffic straight to the engine, dated now and followed by probes.
    """
    probed = probe_in_flight is not None
    if traffic is None:
        if not probed:
            return Seen(
                busy=direct_before, direct_activity=direct_before, last_activity=last_activity
            )
        active = bool(probe_in_flight) or bool(probe_finished)
        return Seen(
            busy=bool(probe_in_flight),
            direct_activity=active,
            last_activity=now if active else last_activity,
        )
    direct = direct_before
    if probed:
        unexplained_busy = (probe_in_flight or 0) > traffic.in_flight
        # What the gateway had in flight when scraped may have ended by the time of the probe.
        unexplained_done = (probe_finished or 0) > (traffic_sent_since or 0) + traffic.in_flight
        direct = unexplained_busy or unexplained_done
    # Never later than now: a gateway replica whose clock runs ahead must not delay sleeps.
    latest = max(last_activity, min(traffic.last or last_activity, now))
    if traffic.in_flight > 0 or (probed and direct):
        latest = now
    return Seen(
        busy=traffic.in_flight > 0 or (probed and bool(probe_in_flight)),
        direct_activity=direct,
        last_activity=latest,
    )
