"""Keep what adaptive routing learnt across restarts and reloads (an app-lifespan block).

:func:`persisted_learning` loads the state file into the gateway's learner before the app
serves, saves it every ``state_save_interval_s`` when something was learnt (serialized on the
event loop, written in a worker thread), after every config reload, and on shutdown. The file
format and its atomic write are in :mod:`gateway.learning.store`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from gateway.background import BackgroundTasks
from gateway.learning.store import LearningStore
from gateway.service import Gateway
from gateway.settings import Settings


async def save_soon(store: LearningStore, gateway: Gateway) -> None:
    """Snapshot the learner now and write it off the event loop (if it changed)."""
    data = store.snapshot(gateway.feedback.learner)
    if data is not None:
        await asyncio.to_thread(store.write, data)


@contextlib.asynccontextmanager
async def persisted_learning(
    gateway: Gateway, settings: Settings, tasks: BackgroundTasks
) -> AsyncIterator[None]:
    """Load, periodically save (a task of ``tasks``, which must be cancelled before this
    block exits) and finally save ``gateway``'s adaptive estimates at
    ``settings.state_path()`` (nothing when persistence is off)."""
    path = settings.state_path()
    if path is None:
        yield
        return
    store = LearningStore(path)
    await asyncio.to_thread(store.load, gateway.feedback.learner)
    pending: set[asyncio.Task[None]] = set()

    def after_reload() -> None:
        task = asyncio.ensure_future(save_soon(store, gateway))
        pending.add(task)
        task.add_done_callback(pending.discard)

    gateway.reload_hooks.append(after_reload)
    saver = tasks.every(
        settings.state_save_interval_s, lambda: save_soon(store, gateway), "specgate-state-saver"
    )
    try:
        yield
    finally:
        saver.cancel()  # already done when the runtime closes its tasks first
        with contextlib.suppress(asyncio.CancelledError):
            await saver
        gateway.reload_hooks.remove(after_reload)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        store.save(gateway.feedback.learner)  # small file: written before the process ends
