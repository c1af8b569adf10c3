"""Admission: at most `limit` requests run at once; the rest wait in FIFO order, none refused."""

from __future__ import annotations

import asyncio
from collections import deque


class Scheduler:
    """A FIFO slot counter whose running and waiting counts `/v1/loads` and `/metrics` report."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        if self.limit is None or (self.running < self.limit and not self._waiters):
            self.running += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we were cancelled: pass it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # hand the slot over: `running` stays the same
                return
        self.running -= 1
