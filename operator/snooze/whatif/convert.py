"""Turn a Prometheus range query of the gateway's `snooze_gateway_requests_total` (the JSON of
/api/v1/query_range) into a whatif trace: each step's increase becomes that many requests,
spread evenly over the step (a counter says how many, not exactly when)."""

from __future__ import annotations

import json
import math
from typing import Any

from snooze.whatif.trace import Request, TraceError

METRIC = "snooze_gateway_requests_total"


def from_prometheus(text: str, *, source: str = "query_range JSON") -> list[Request]:
    """The requests a range query's counter series add up to, per `model` label."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{source}: not JSON ({exc}); save the body of /api/v1/query_range"
        ) from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise TraceError(
            f"{source}: not a range query's answer (data.resultType matrix): query "
            f"/api/v1/query_range?query={METRIC}&start=...&end=...&step=60"
        )
    requests: list[Request] = []
    for series in data.get("result") or []:
        requests.extend(_series(series, source))
    if not requests:
        raise TraceError(f"{source}: the series never increase: no request in that range")
    requests.sort(key=lambda r: (r.at, r.model))
    return requests


def _series(series: Any, source: str) -> list[Request]:
    labels = series.get("metric") or {}
    name = labels.get("__name__")
    if name not in (None, METRIC):
        raise TraceError(f"{source}: a series of {name}, not of {METRIC}")
    model = labels.get("model")
    if not model:
        raise TraceError(f"{source}: a series without a model label: query {METRIC} as it is")
    out: list[Request] = []
    previous: tuple[float, float] | None = None
    for stamp, value in series.get("values") or []:
        at, total = float(stamp), float(value)
        if not (math.isfinite(at) and math.isfinite(total)):
            continue
        if previous is not None:
            before_at, before = previous
            # A counter that went down restarted from zero (the gateway restarted).
            added = round(total - before if total >= before else total)
            step = at - before_at
            out.extend(
                Request(at=before_at + step * (k + 0.5) / added, model=model) for k in range(added)
            )
        previous = (at, total)
    return out
