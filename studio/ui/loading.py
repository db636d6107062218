"""Load something off the UI thread and show only the newest result.

A page that reads a result in a thread (a profile's timeline, a roofline, a layer diff, the
project's current keys) starts a load each time its inputs change; an older load can finish
after a newer one, or after the project was closed. :class:`LatestLoad` runs the work in the
controller's thread pool and hands the result (or the exception) to the page on the UI
thread only when no newer load was started, :meth:`LatestLoad.drop` was not called since,
and the same project session is still open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class LatestLoad:
    """One kind of background load of one page; the newest :meth:`start` wins."""

    def __init__(self, ctl) -> None:
        self.ctl = ctl
        self._gen = 0
        #: the task of the newest load (None before the first one, or without an event loop)
        self.task: asyncio.Future | None = None

    def drop(self) -> None:
        """Forget the load under way: its result will not be shown."""
        self._gen += 1

    def start(
        self,
        work: Callable[..., Any],
        *args: Any,
        done: Callable[[Any], None],
        failed: Callable[[Exception], None],
    ) -> asyncio.Future | None:
        """Run ``work(*args)`` in a thread; then, unless superseded, ``done(result)`` or
        ``failed(exception)`` on the UI thread. Returns the task (None without a loop)."""
        self._gen += 1
        gen = self._gen
        studio = self.ctl.studio

        def current() -> bool:
            return gen == self._gen and self.ctl.studio is studio

        async def go() -> None:
            try:
                got = await self.ctl.in_thread(work, *args)
            except Exception as exc:  # noqa: BLE001 - the page shows it; the app stays up
                if current():
                    failed(exc)
                return
            if current():
                done(got)

        try:
            self.task = asyncio.ensure_future(go())
        except RuntimeError:  # no event loop (a bare QApplication)
            self.task = None
        return self.task
