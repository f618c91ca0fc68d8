"""The app's typed runtime: one lifespan builds it and tears it down (issue 14, item 2)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from gateway.app import create_app
from gateway.runtime import BackgroundTasks, Runtime, runtime_of
from tests.unit.conftest import ROOT, gateway_settings, in_process, local_config


async def test_shutdown_cancels_every_background_task_and_removes_sighup() -> None:
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    async with in_process(gateway_settings(canary_interval_s=300)) as gw:
        runtime = runtime_of(gw.app)
        assert isinstance(runtime, Runtime)
        tasks = list(runtime.tasks.tasks)
        names = {task.get_name() for task in tasks}
        assert {"specgate-health", "specgate-canary", "specgate-history"} <= names
        assert not any(task.done() for task in tasks)
        assert signal.getsignal(signal.SIGHUP) != signal.SIG_DFL  # the reload handler
    assert all(task.cancelled() for task in tasks)
    assert runtime.tasks.tasks == []
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL


async def test_sighup_reloads_while_running() -> None:
    async with in_process(gateway_settings(config=ROOT / "config" / "local.yaml")) as gw:
        gateway = runtime_of(gw.app).gateway
        signal.raise_signal(signal.SIGHUP)
        for _ in range(100):
            if gateway.reloads:
                break
            await asyncio.sleep(0.01)
        assert gateway.reloads == 1


async def test_the_runtime_exists_only_once_the_lifespan_started() -> None:
    app = create_app(gateway_settings(), config=local_config())
    with pytest.raises(RuntimeError, match="lifespan has not started"):
        runtime_of(app)


async def test_background_tasks_close_once_and_log_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fail() -> None:
        raise ValueError("boom")

    tasks = BackgroundTasks()
    sleeper = tasks.start(asyncio.sleep(60), "sleeper")
    tasks.start(fail(), "failing")
    await asyncio.sleep(0)
    await tasks.aclose()
    await tasks.aclose()  # idempotent
    assert sleeper.cancelled()
    assert "background task failing failed" in caplog.text


async def test_a_background_loop_outlives_a_failing_step(caplog: pytest.LogCaptureFixture) -> None:
    """``every`` logs a step's error and runs it again at the next interval (a canary round
    that raised used to end its loop until restart, reported only at shutdown); plain
    functions are steps too, and the interval may be read before each wait."""
    calls: list[str] = []
    interval = [0.01]

    async def flaky() -> None:
        calls.append("async")
        if len(calls) == 1:
            raise KeyError("ngram")

    tasks = BackgroundTasks()
    tasks.every(lambda: interval[0], flaky, "flaky", first_s=0.0)
    tasks.every(0.01, lambda: calls.append("sync"), "sync")
    for _ in range(200):
        await asyncio.sleep(0.005)
        if calls.count("async") >= 3 and calls.count("sync") >= 2:
            break
    await tasks.aclose()
    assert calls.count("async") >= 3 and calls.count("sync") >= 2
    assert "background task flaky: a step failed; the next in 0.01 s" in caplog.text
    assert "KeyError: 'ngram'" in caplog.text  # with its traceback
