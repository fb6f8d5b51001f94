"""Watch streams of the sandbox: a history of changes to resume from, and one queue per watcher."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Callable

import aiohttp.web

from snooze.sandbox import api, views
from snooze.sandbox.api import ApiError, ApiPath
from snooze.sandbox.discovery import ResourceSpec
from snooze.sandbox.views import Change, Obj

# How many past changes a watch can resume from; older resourceVersions get 410 Gone.
HISTORY_LIMIT = 10_000


class Watches:
    """Every change since the sandbox started (up to HISTORY_LIMIT) and the watchers now open."""

    def __init__(self) -> None:
        self.history: collections.deque[Change] = collections.deque(maxlen=HISTORY_LIMIT)
        self._watchers: set[asyncio.Queue[Change | None]] = set()

    def publish(self, change: Change) -> None:
        self.history.append(change)
        for queue in self._watchers:
            queue.put_nowait(change)

    def close(self) -> None:
        """End every watch stream now, so that the server can stop without waiting for them."""
        for queue in self._watchers:
            queue.put_nowait(None)

    async def serve(
        self,
        raw: aiohttp.web.BaseRequest,
        spec: ResourceSpec,
        path: ApiPath,
        *,
        current: Callable[[], list[Obj]],
        rv: int,
        render: Callable[[Obj], Obj],
    ) -> aiohttp.web.StreamResponse:
        """Stream one watch: `current` lists the objects now, `rv` is the latest resourceVersion.

        `render` turns each event into what is sent (a Table, for a client that asked for one).
        """
        query = raw.query
        predicate = views.predicate(spec, query)
        if path.name is not None:
            # A watch of one object (kubectl get NAME --watch) is a watch with a name selector.
            by_name = predicate
            predicate = lambda o: o["metadata"]["name"] == path.name and by_name(o)  # noqa: E731
        since = query.get("resourceVersion", "")
        send_initial = query.get("sendInitialEvents") == "true" or since in ("", "0")
        bookmarks = query.get("allowWatchBookmarks") == "true"
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        key = (spec.group, spec.version, spec.plural)

        # Nothing awaits between the snapshot and the subscription, so no change slips between.
        queue: asyncio.Queue[Change | None] = asyncio.Queue()
        backlog: list[Obj] = []
        gone = False
        if send_initial:
            backlog = [{"type": "ADDED", "object": o} for o in current() if predicate(o)]
            if query.get("sendInitialEvents") == "true" and bookmarks:
                backlog.append(views.bookmark(spec, str(rv), initial_end=True))
        else:
            if not since.isdigit():
                raise ApiError(400, f"invalid resourceVersion: {since!r}")
            oldest = self.history[0].rv if self.history else rv + 1
            gone = int(since) < oldest - 1 and int(since) < rv
            for change in self.history:
                if change.rv > int(since):
                    event = views.as_event(change, key, path.namespace, predicate)
                    if event is not None:
                        backlog.append(event)
        self._watchers.add(queue)
        try:
            response = aiohttp.web.StreamResponse(
                status=200, headers={"Content-Type": "application/json"}
            )
            await response.prepare(raw)
            if gone:
                # Like etcd after compaction: the client must list again.
                err = api.status_body(410, f"too old resource version: {since} ({rv})")
                await response.write(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
                return response
            for event in backlog:
                await response.write(json.dumps(render(event)).encode() + b"\n")
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while True:
                wait = 1.0 if deadline is None else min(1.0, deadline - loop.time())
                if wait <= 0:
                    break
                try:
                    item = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    if raw.transport is None or raw.transport.is_closing():
                        break  # the client went away; nothing else would notice
                    continue
                if item is None:
                    break
                event = views.as_event(item, key, path.namespace, predicate)
                if event is not None:
                    await response.write(json.dumps(render(event)).encode() + b"\n")
            return response
        except ConnectionError:
            # The client left (`kubectl wait` does once its condition holds) and this change
            # was the first to find out: the watch simply ends, as an API server's does. A
            # reset while a write waited for room comes as aiohttp's plain ConnectionError.
            return response
        finally:
            self._watchers.discard(queue)
