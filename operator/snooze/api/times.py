"""Times as Snooze writes them on the API (status fields, annotations): RFC 3339 in UTC to the
millisecond with a `Z`, as Kubernetes writes its own, and read back leniently."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import PlainSerializer


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 time as seconds since the epoch; None if absent or unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return seconds_of(moment)


def format_time(seconds: float) -> str:
    """Seconds since the epoch as the RFC 3339 form Kubernetes writes (UTC, `Z`)."""
    return _written(datetime.fromtimestamp(seconds, tz=UTC))


def moment(seconds: float) -> datetime:
    """Seconds since the epoch as a status keeps them: in UTC, to the millisecond (so that a
    time built now equals the same time read back from what was written)."""
    exact = datetime.fromtimestamp(seconds, tz=UTC)
    return exact.replace(microsecond=exact.microsecond // 1000 * 1000)


def seconds_of(moment: datetime) -> float:
    """A time read from the API as seconds since the epoch (one without a zone is in UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _written(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


Time = Annotated[datetime, PlainSerializer(_written, return_type=str, when_used="json")]
"""A time field of a status: written as format_time writes it."""
