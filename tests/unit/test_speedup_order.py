"""bench.speedup's waves: every target serves every wave once, in an order drawn from
``--order-seed``, so repeats given seeds of their own put targets in other positions
(docs/benchmarks.md section 7, "Tenth run")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import speedup
from bench.workloads import Item, arrival_order, waves
from contracts.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "config" / "local.yaml"


def _orders(monkeypatch: pytest.MonkeyPatch, seed: int) -> list[list[str]]:
    """The target order of each wave of ``bench.speedup.measure`` at c = 2 and 4 (8 items),
    with the HTTP calls replaced by a recorder."""
    config = load_config(CONFIG)
    urls = {b.base_url: name for name, b in config.backends.items()}
    urls |= {"http://gateway": "specgate", "http://adaptive": "adaptive"}
    called: list[str] = []

    def run_items(url: str, *_: Any, **kw: Any) -> tuple[list[Any], float]:
        if kw["max_tokens"] != 8:  # not the warm-up
            called.append(urls[url])
        return [], 0.0

    monkeypatch.setattr(speedup, "run_items", run_items)
    monkeypatch.setattr(speedup, "scrape", lambda _config: {})
    monkeypatch.setattr(speedup.time, "sleep", lambda _s: None)
    items = [Item("chat", str(i), "/v1/chat/completions", {"messages": []}, 10) for i in range(8)]
    backends = list(config.backends)
    extra = [("adaptive", "http://adaptive")]
    speedup.measure(
        config, "http://gateway", items, [2, 4], 64, backends, extra, 0.0, order_seed=seed
    )
    n = len(backends) + 2
    return [called[i : i + n] for i in range(0, len(called), n)]


def test_every_target_serves_every_wave_once(monkeypatch: pytest.MonkeyPatch) -> None:
    waves = _orders(monkeypatch, 0)
    assert len(waves) == 4 + 2  # 8 items: four waves at c=2, two at c=4
    targets = {*load_config(CONFIG).backends, "specgate", "adaptive"}
    assert all(sorted(w) == sorted(targets) for w in waves)


def test_the_order_seed_decides_the_orders(monkeypatch: pytest.MonkeyPatch) -> None:
    first, again = _orders(monkeypatch, 0), _orders(monkeypatch, 0)
    assert first == again  # one seed: the same positions in every run
    others = [_orders(monkeypatch, seed) for seed in (1, 2, 3)]
    assert all(o != first for o in others)
    # the target that opens the first wave is not the same for every seed
    assert len({w[0][0] for w in [first, *others]}) > 1


def test_every_target_gets_each_wave_in_one_shuffled_arrival_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each wave goes out in ``bench.workloads.arrival_order`` (the sample cycles code, rag,
    chat, creative: sent as sampled, code opened every wave, so a gateway's burst was always
    first routed for code), the same order to every target."""
    config = load_config(CONFIG)
    sent: dict[str, list[list[str]]] = {}

    def run_items(url: str, _model: str, wave: Any, **kw: Any) -> tuple[list[Any], float]:
        if kw["max_tokens"] != 8:  # not the warm-up
            sent.setdefault(url, []).append([item.task for item in wave])
        return [], 0.0

    monkeypatch.setattr(speedup, "run_items", run_items)
    monkeypatch.setattr(speedup, "scrape", lambda _config: {})
    monkeypatch.setattr(speedup.time, "sleep", lambda _s: None)
    tasks = ("code", "rag", "chat", "creative")
    items = [Item(t, f"{t}-{i}", "/v1/chat/completions", {}, 10) for i in range(8) for t in tasks]
    speedup.measure(config, "http://gateway", items, [4], 64, list(config.backends), (), 0.0)
    orders = list(sent.values())
    assert len(orders) == len(config.backends) + 1 and all(o == orders[0] for o in orders)
    waves = orders[0]
    assert len(waves) == 8 and all(sorted(w) == sorted(tasks) for w in waves)
    assert len({w[0] for w in waves}) > 1  # not every wave opened by code


def _sample(per_task: int) -> list[Item]:
    """A sample as ``bench.workloads.sample`` deals it: tasks interleaved."""
    tasks = ("code", "rag", "chat", "creative")
    return [Item(t, f"{t}-{i}", "/v1/completions", {}, 10) for i in range(per_task) for t in tasks]


def test_mixed_waves_are_runs_of_the_sample_in_arrival_order() -> None:
    items = _sample(3)  # 12 items
    dealt = waves(items, 4)
    assert [len(w) for w in dealt] == [4, 4, 4]
    assert dealt == [arrival_order(items[i : i + 4], seed=i) for i in (0, 4, 8)]
    assert all({i.task for i in w} == {"code", "rag", "chat", "creative"} for w in dealt)


def test_per_task_waves_hold_one_task_each_and_take_turns() -> None:
    """Each task's items in runs of c (the last shorter), the tasks in turn; every item
    once, so each (task, c) cell's oracle is one routing choice away."""
    items = _sample(5)  # 20 items, 5 a task
    dealt = waves(items, 2, "per-task")
    assert [w[0].task for w in dealt] == ["code", "rag", "chat", "creative"] * 3
    assert [len(w) for w in dealt] == [2] * 8 + [1] * 4
    assert all(len({i.task for i in w}) == 1 for w in dealt)
    assert sorted(i.id for w in dealt for i in w) == sorted(i.id for i in items)
    first = dealt[0]  # code-0 and code-1, seeded by code-0's position (0)
    assert first == arrival_order([items[0], items[4]], seed=0)
    assert waves(items, 2, "per-task") == dealt  # repeats deal alike
    with pytest.raises(ValueError):
        waves(items, 0)
    with pytest.raises(ValueError):
        waves(items, 2, "by-length")
