"""gateway.turns: one holder per turn of the event loop, so what a holder started (an
upstream connection, a body write) is served before the next holder's turn."""

from __future__ import annotations

import asyncio

import pytest

from gateway.turns import Turns
from tests.unit.conftest import MODEL, InProcess


async def _burst(turns: Turns | None, n: int, log: list[str]) -> None:
    """``n`` tasks ready at once, each doing its work (``hold``) under a turn (or none) and
    scheduling a callback there, as a socket's completion would be (``io``)."""
    loop = asyncio.get_running_loop()

    async def one(i: int) -> None:
        if turns is None:
            log.append(f"hold{i}")
            loop.call_soon(log.append, f"io{i}")
            return
        async with turns.take():
            log.append(f"hold{i}")
            loop.call_soon(log.append, f"io{i}")

    await asyncio.gather(*(one(i) for i in range(n)))
    await asyncio.sleep(0)


async def test_without_turns_a_burst_runs_every_hold_before_any_io() -> None:
    log: list[str] = []
    await _burst(None, 3, log)
    assert log == ["hold0", "hold1", "hold2", "io0", "io1", "io2"]


async def test_with_turns_each_holder_io_runs_before_the_next_hold() -> None:
    log: list[str] = []
    await _burst(Turns(), 3, log)
    assert log == ["hold0", "io0", "hold1", "io1", "hold2", "io2"]


async def test_a_lone_holder_does_not_wait() -> None:
    turns, loop = Turns(), asyncio.get_running_loop()
    entered: list[bool] = []

    async def alone() -> None:
        async with turns.take():
            entered.append(True)

    task = loop.create_task(alone())
    await asyncio.sleep(0)  # one turn: the task ran to its end without waiting
    assert entered == [True] and task.done()
    await asyncio.sleep(0)
    async with turns.take():  # and the turn was handed back: the next one passes too
        pass


async def test_a_failing_holder_hands_the_turn_on() -> None:
    turns, done = Turns(), []

    async def fails() -> None:
        async with turns.take():
            raise ValueError("prepare failed")

    async def after() -> None:
        async with turns.take():
            done.append("after")

    results = await asyncio.gather(fails(), after(), return_exceptions=True)
    assert isinstance(results[0], ValueError) and done == ["after"]


def _named(turns: Turns, log: list[str]):  # type: ignore[no-untyped-def]
    """A coroutine function: enter ``turns`` and log the name."""

    async def one(name: str) -> None:
        async with turns.take():
            log.append(name)

    return one


async def test_a_waiter_cancelled_in_the_queue_is_skipped() -> None:
    turns, log = Turns(), []
    one, loop = _named(turns, log), asyncio.get_running_loop()
    first, second, third = (loop.create_task(one(n)) for n in ("a", "b", "c"))
    await asyncio.sleep(0)  # "a" held its turn; "b" and "c" wait
    second.cancel()
    await asyncio.wait_for(asyncio.gather(first, third), timeout=1)
    with pytest.raises(asyncio.CancelledError):
        await second
    assert log == ["a", "c"]
    await asyncio.wait_for(one("d"), timeout=1)  # the turn is free again
    assert log == ["a", "c", "d"]


async def test_a_waiter_cancelled_after_its_wake_up_hands_the_turn_on() -> None:
    turns, log = Turns(), []
    one, loop = _named(turns, log), asyncio.get_running_loop()
    first, second, third = (loop.create_task(one(n)) for n in ("a", "b", "c"))
    await first
    await asyncio.sleep(0)  # "b" was woken: its future is done, its task not yet resumed
    second.cancel()
    await asyncio.wait_for(third, timeout=1)
    assert log in (["a", "c"], ["a", "b", "c"])  # "b" ran or was cancelled: "c" ran anyway
    await asyncio.wait_for(one("d"), timeout=1)  # and the turn is free again
    assert log[-1] == "d"


async def _turns_of(turns: Turns, n: int, during: list[float] | None = None) -> list[int]:
    """The loop turn in which each of ``n`` tasks, ready at once, entered ``turns``."""
    loop = asyncio.get_running_loop()
    turn, entered = [0], []

    def tick() -> None:  # counts the loop's turns
        turn[0] += 1
        loop.call_soon(tick)

    async def one() -> None:
        async with turns.take():
            entered.append(turn[0])
            if during:
                during[0] += 0.004  # the clock moves 4 ms a prepare

    loop.call_soon(tick)
    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n))), timeout=1)
    return [entered.count(t) for t in sorted(set(entered))]


async def test_one_a_turn_while_none_waited_too_long() -> None:
    assert await _turns_of(Turns(), 10) == [1] * 10


async def test_those_that_waited_too_long_enter_together() -> None:
    """With each prepare taking 4 ms and 10 ms the longest wait, one a turn until the
    queue's head has waited 10 ms; from then on each turn admits every overdue one."""
    now = [0.0]
    turns = Turns(max_wait_s=0.010, clock=lambda: now[0])
    per_turn = await _turns_of(turns, 10, during=now)
    # the first enters at 0 and prepares until 4 ms; the 9 others queue at 4 ms. One a turn
    # at 4, 8 and 12 ms; at 16 ms the 6 left have waited 12 ms: all enter
    assert per_turn == [1, 1, 1, 1, 6]


async def test_routed_requests_take_a_turn_to_prepare(
    gw: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The routed endpoints prepare under the runtime's turns (gateway/api/openai.py)."""
    taken: list[Turns] = []
    take = Turns.take

    def counted(self: Turns):  # type: ignore[no-untyped-def]
        taken.append(self)
        return take(self)

    monkeypatch.setattr(Turns, "take", counted)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    answers = await asyncio.gather(
        *(gw.client.post("/v1/chat/completions", json=body) for _ in range(5))
    )
    assert [a.status_code for a in answers] == [200] * 5
    assert len(taken) == 5 and {id(t) for t in taken} == {id(gw.app.state.runtime.turns)}
