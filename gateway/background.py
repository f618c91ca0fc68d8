"""The app's background loops, owned in one place (:class:`BackgroundTasks`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

logger = logging.getLogger(__name__)


class BackgroundTasks:
    """The app's background loops (health, scraping, canary, history, learning saves):
    started here, cancelled and awaited together by :meth:`aclose` (idempotent)."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``work`` as a task named ``name`` until :meth:`aclose`."""
        task = asyncio.create_task(work, name=name)
        self.tasks.append(task)
        return task

    def every(
        self,
        interval_s: float | Callable[[], float],
        step: Callable[[], Awaitable[object] | None],
        name: str,
        *,
        first_s: float | None = None,
    ) -> asyncio.Task[None]:
        """Run ``step`` (a coroutine function, or a plain function) every ``interval_s``
        seconds (a number, or a function read before each wait, for an interval that can
        change at run time), the first time ``first_s`` from now (default: one interval),
        until :meth:`aclose`: the one loop of the poller, the canaries, the history, the
        state sync and the learning saver.

        A step that raises is logged with its traceback and the loop goes on at the next
        interval: one unexpected error (a backend removed by a reload while a canary round
        ran, say) must not stop a check for the rest of the process's life, which used to
        be reported only at shutdown.
        """
        wait = interval_s if callable(interval_s) else lambda: interval_s

        async def loop() -> None:
            await asyncio.sleep(wait() if first_s is None else first_s)
            while True:
                try:
                    done = step()
                    if done is not None:
                        await done
                except Exception:
                    logger.exception(
                        "background task %s: a step failed; the next in %g s", name, wait()
                    )
                await asyncio.sleep(wait())

        return self.start(loop(), name)

    async def aclose(self) -> None:
        """Cancel every task and wait for them to end (a task that failed is logged)."""
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            task.cancel()
        for task, outcome in zip(
            tasks, await asyncio.gather(*tasks, return_exceptions=True), strict=True
        ):
            if isinstance(outcome, Exception):
                logger.error("background task %s failed: %r", task.get_name(), outcome)
