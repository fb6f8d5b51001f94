"""An endpoint picker's metrics page, read for one gauge: the requests its flow-control queue
holds, per target model. Read as an engine's page is (engine/exposition.py), a chunk at a time,
only that gauge's lines parsed, every value checked: a picker is a peer the operator does not
trust (anyone who may create an InferencePool names one).

The gauge, read in the Inference Extension's source, release v1.5.0 (`pkg/epp/metrics/
metrics.go`, raised and lowered around each request by `pkg/epp/flowcontrol/controller/
controller.go`'s EnqueueAndWait): `inference_extension_flow_control_queue_size{fairness_id,
priority, inference_pool, model_name, target_model_name}`. llm-d's router, which carries the
picker on, names it `llm_d_epp_flow_control_queue_size`.
"""

from __future__ import annotations

from snooze.engine.activity import REQUESTS_LIMIT
from snooze.engine.exposition import Labels, Page, checked_count

QUEUE_SIZE = "inference_extension_flow_control_queue_size"
LLMD_QUEUE_SIZE = "llm_d_epp_flow_control_queue_size"
FAMILIES = frozenset({QUEUE_SIZE, LLMD_QUEUE_SIZE})
TARGET_LABEL = "target_model_name"
"""The model a request is sent to (after the picker's rewrites): the engine's model name."""
# A series per (fairness id, priority, pool, model, target): tenants times models.
SERIES_LIMIT = 65536
# The most read of a picker's page. It carries every metric of the picker (histograms per
# model among them), of which only the gauge's lines are parsed.
PAGE_LIMIT = 16 << 20

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def unescaped(text: str) -> str:
    """A label value as written between quotes, its escapes read (\\\\, \\", \\n); ValueError
    for an escape the exposition format has not."""
    out: list[str] = []
    chars = iter(text)
    for char in chars:
        if char != "\\":
            out.append(char)
            continue
        escaped = _ESCAPES.get(next(chars, ""))
        if escaped is None:
            raise ValueError(f"a label value with an unknown escape: {text[:80]!r}")
        out.append(escaped)
    return "".join(out)


class QueuePage:
    """One picker replica's page, fed a chunk at a time: the requests queued per target model.
    ValueError for a malformed page or a value no queue holds (NaN, infinite, negative, beyond
    any count): the page is then not used at all."""

    def __init__(self) -> None:
        self._page = Page(FAMILIES, self._sample, series_limit=SERIES_LIMIT)
        self._queued: dict[str, float] = {}

    def feed(self, chunk: bytes) -> None:
        self._page.feed(chunk)

    def result(self) -> dict[str, int]:
        """Target model -> requests queued for it (over every fairness id and priority)."""
        self._page.close()
        return {model: round(count) for model, count in self._queued.items() if count}

    def _sample(self, name: str, labels: Labels, value: float) -> None:
        count = checked_count(name, value, REQUESTS_LIMIT)
        target = labels.get(TARGET_LABEL)
        if target is None:
            return  # belongs to no model: nothing here to wake
        model = unescaped(target)
        total = self._queued.get(model, 0.0) + count
        self._queued[model] = checked_count(name, total, REQUESTS_LIMIT, summed=True)


def read_queue(text: str) -> dict[str, int]:
    """Pure: a whole page's queue per target model; ValueError as QueuePage says."""
    page = QueuePage()
    page.feed(text.encode())
    return page.result()
