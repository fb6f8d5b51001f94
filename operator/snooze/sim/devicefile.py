"""A simulated GPU whose books are kept in a file, so that engines of several processes share
its memory, as the pods of one node share a real device (through a hostPath both mount)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from snooze.sim.device import GIB, SimulatedDevice


class DeviceFileError(ValueError):
    """The device file cannot be used as asked; the message says why and what to do."""


class DeviceFile(SimulatedDevice):
    """A shared device whose holdings live in `path`, guarded by a lock file beside it.

    Memory is held per process, as on a real GPU: each process holds a lock of its own for as
    long as it lives, and whatever a process whose lock is free held (it ended, or was killed)
    goes back to the device at the next look at the books.
    """

    def __init__(self, *, name: str, memory_gib: float, path: Path) -> None:
        super().__init__(name=name, memory_gib=memory_gib, shared=True)
        self.path = path
        self._holders = path.with_name(path.name + ".holders")
        try:
            self._holders.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise DeviceFileError(
                f"cannot use {path} as a device file ({error.strerror}): give a path in a "
                "writable folder that every engine sharing the device mounts"
            ) from None
        self._me = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # Held until the process ends: the others read a free lock as "that process is gone".
        self._life: TextIO = (self._holders / f"{self._me}.lock").open("w")
        fcntl.flock(self._life, fcntl.LOCK_EX)
        with self._books() as books:
            total = books.setdefault("total_bytes", self.total_bytes)
            if total != self.total_bytes:
                raise DeviceFileError(
                    f"{path} holds a device of {total / GIB:g} GiB, not {memory_gib:g} GiB: "
                    "give every engine that shares it the same --shared-gpu-gib"
                )

    def _key(self, holder: object) -> str:
        return f"{self._me}/{id(holder)}"

    @contextlib.contextmanager
    def _books(self) -> Iterator[dict[str, Any]]:
        """The books, read under the file's lock and written back when the block ends."""
        with self._lock, self.path.with_name(self.path.name + ".lock").open("a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                books: dict[str, Any] = json.loads(self.path.read_text() or "{}")
            except FileNotFoundError:
                books = {}
            books.setdefault("held", {})
            self._reap(books)
            yield books
            partial = self.path.with_name(self.path.name + f".{self._me}")
            partial.write_text(json.dumps(books))
            partial.replace(self.path)

    def _reap(self, books: dict[str, Any]) -> None:
        """Give back what processes that ended held."""
        held: dict[str, int] = books["held"]
        for process in {key.split("/", 1)[0] for key in held}:
            if process == self._me:
                continue
            lock = self._holders / f"{process}.lock"
            alive = False
            try:
                with lock.open("a") as probe:
                    try:
                        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        alive = True
            except FileNotFoundError:
                pass
            if not alive:
                for key in [k for k in held if k.startswith(process + "/")]:
                    del held[key]
                lock.unlink(missing_ok=True)

    @property
    def used_bytes(self) -> int:
        with self._books() as books:
            return sum(books["held"].values())

    def held_by(self, holder: object) -> int:
        with self._books() as books:
            return int(books["held"].get(self._key(holder), 0))

    def allocate(self, holder: object, nbytes: int) -> bool:
        with self._books() as books:
            held = books["held"]
            if self.total_bytes - sum(held.values()) < nbytes:
                self.oom_total += 1
                return False
            key = self._key(holder)
            held[key] = held.get(key, 0) + nbytes
            return True

    def release(self, holder: object, nbytes: int) -> None:
        with self._books() as books:
            key = self._key(holder)
            left = books["held"].get(key, 0) - nbytes
            if left > 0:
                books["held"][key] = left
            else:
                books["held"].pop(key, None)

    def release_all(self, holder: object) -> None:
        with self._books() as books:
            books["held"].pop(self._key(holder), None)
