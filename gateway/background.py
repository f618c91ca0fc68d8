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
        self, interval_s: float, step: Callable[[], Awaitable[object]], name: str
    ) -> asyncio.Task[None]:
        """Run ``step`` every ``interval_s`` seconds, the first time one interval from now,
        until :meth:`aclose` (a loop written once for the poller, the canary, the state
        sync and the learning saver)."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                await step()

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
