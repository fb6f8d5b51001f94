"""What both engine clients (vLLM's, SGLang's) do alike over an EngineHttp: own or share the
session, send one request within a deadline, read a JSON object; each says in its own words
what an unreadable or late answer means."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from snooze.engine.errors import EngineError
from snooze.engine.http import ANSWER_LIMIT, Answer, EngineHttp, Params, Sink


class OverHttp(ABC):
    """An engine's client over an EngineHttp: a shared one when given (then `aclose` leaves
    it open, its owner closes it), else one of its own, closed with the client."""

    def __init__(
        self,
        base_url: str,
        timeout: float,
        client: EngineHttp | None,
        own: Callable[[], EngineHttp],
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._owns_client = client is None
        self._client = client if client is not None else own()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session if this client owns it."""
        if self._owns_client:
            await self._client.aclose()

    async def _send(
        self,
        method: str,
        path: str,
        *,
        budget: float | None = None,
        params: Params = None,
        json: Any = None,
        limit: int = ANSWER_LIMIT,
        sink: Sink | None = None,
    ) -> Answer:
        """Send one request with a total deadline (`budget`, else the client's timeout) and
        read at most `limit` bytes of its answer (to `sink`, if given), whatever its status."""
        total = self.timeout if budget is None else budget
        try:
            # Connecting is quick or hopeless, even during a minutes-long wake. The deadline
            # counts from the request's turn in the shared session (see EngineHttp).
            return await self._client.request(
                method,
                self.base_url + path,
                total=total,
                connect=min(total, self.timeout),
                params=params,
                json=json,
                limit=limit,
                sink=sink,
            )
        except TimeoutError as error:
            raise self._timed_out(path, total) from error

    def _json(self, answer: Answer, path: str) -> dict[str, Any]:
        try:
            data = json.loads(answer.body)
        except ValueError as error:
            raise self._unreadable(path, "not JSON", status=answer.status) from error
        if not isinstance(data, dict):
            raise self._unreadable(path, "not a JSON object", status=answer.status)
        return data

    @abstractmethod
    def _unreadable(self, path: str, what: str, *, status: int = 200) -> EngineError:
        """The error of an answer at `path` that cannot be read or believed (`what`)."""

    @abstractmethod
    def _timed_out(self, path: str, timeout: float) -> EngineError:
        """The error of a request to `path` that outlived `timeout` seconds."""
