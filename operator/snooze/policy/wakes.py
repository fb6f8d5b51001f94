"""When a wake request stands: one annotation per wake, whoever asks for it (the gateway for a
request it holds, the operator for requests queued at an Inference Extension's endpoint
picker). Pure."""

from __future__ import annotations


def wake_pending(
    *,
    requested_at: float | None,
    slept_at: float | None,
    now: float,
    wake_timeout: float,
    recent: float,
) -> bool:
    """Whether a wake request already stands, so that asking again would be noise.

    A request stands while it is newer than the pods' latest sleep (unknown: any) and its
    wake may still be under way: within `wake_timeout`, and never less than `recent`
    seconds, so that replicas asking at once write one annotation between them.
    """
    if requested_at is None:
        return False
    if slept_at is not None and requested_at <= slept_at:
        return False  # the pods slept after it: that wake is over
    return requested_at > now - max(wake_timeout, recent)


def queue_wakes(*, queued: int | None, awake: int, pending: bool) -> bool:
    """Whether requests queued for a model at its endpoint pickers ask for a wake now, as a
    request the gateway holds does: some are queued, no engine of the model serves, and no
    wake request stands (`pending`, wake_pending's word): once per burst, and again only once
    that wake is over or timed out."""
    return bool(queued) and awake == 0 and not pending
