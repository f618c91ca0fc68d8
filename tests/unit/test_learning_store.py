"""What adaptive routing learnt survives restarts and reloads: the versioned state file, its
atomic write, setting aside a file it cannot read, and a restarted gateway that routes like the
one before it from its first request."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gateway.app import create_app
from gateway.learning.store import KIND, VERSION, LearningStore
from gateway.routing.adaptive import Learner, Observation
from gateway.settings import Settings
from gateway.state.learning import SharedLearner
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.transport import BackendsTransport
from tests.unit.conftest import MODEL, local_config

CODE = {"model": MODEL, "prompt": "def fib(n):\n    ", "max_tokens": 8, "temperature": 0}
# the rules would pick a speculative backend (eagle3, ngram or draft)
SPEEDS = {"plain": 40.0, "eagle3": 25.0, "ngram": 20.0, "draft": 8.0}


def taught(learner: Learner, n: int = 30) -> Learner:
    for _ in range(n):
        for backend, speed in SPEEDS.items():
            learner.observe(Observation("code", "greedy/norep", backend, speed, 64))
    return learner


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The shipped config in front of fake backends, lifespan entered and exited (exit saves)."""
    config = local_config()
    apps = {
        b.base_url.removeprefix("http://"): create_fake_vllm(FakeBehaviour(name=n))
        for n, b in config.backends.items()
    }
    app = create_app(
        settings, config=config, transport=BackendsTransport(apps), rng=random.Random(1)
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield app, client


def test_default_path_is_under_the_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPECGATE_STATE_FILE")
    monkeypatch.setenv("SPECGATE_CACHE_DIR", str(tmp_path))
    assert Settings().state_path() == tmp_path / "state" / "adaptive-routing.json"
    assert Settings(state_file=tmp_path / "x.json").state_path() == tmp_path / "x.json"
    assert Settings(state_persist=False).state_path() is None


def test_write_is_atomic_and_versioned(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "state.json"
    store = LearningStore(path)
    store.save(Learner())
    assert not path.exists()  # nothing learnt: no file
    learner = taught(Learner())
    store.save(learner)
    data = json.loads(path.read_text())
    assert data["kind"] == KIND and data["version"] == VERSION
    assert data["observations"] == learner.observations
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]  # no temporary left
    assert store.snapshot(learner) is None  # nothing new learnt: nothing to write
    copy = Learner()
    assert LearningStore(path).load(copy) and copy.groups == learner.groups


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        json.dumps({"kind": KIND, "version": 1, "groups": []}).encode(),
        json.dumps({"kind": "someone-else", "version": VERSION}).encode(),
        b"\xff\xfe garbage",
    ],
)
def test_an_unreadable_or_foreign_file_is_set_aside(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    learner = Learner()
    with caplog.at_level(logging.WARNING, logger="gateway.learning.store"):
        assert LearningStore(path).load(learner) is False
    assert learner.observations == 0 and not learner.groups  # learning starts fresh
    assert not path.exists()
    [aside] = tmp_path.glob("state.json.unreadable-*")
    assert aside.read_bytes() == content
    assert "set aside" in caplog.text


async def test_a_restarted_gateway_routes_like_the_one_before_it(tmp_path: Path) -> None:
    settings = Settings(state_file=tmp_path / "state.json", health_interval_s=60)
    async with running(settings) as (app, client):
        taught(app.state.runtime.gateway.feedback.learner)
        before = (await client.post("/routes/explain", json=CODE)).json()
        assert before["backend"] == "plain" and before["adaptive"]["best"] == "plain"
    # shutdown saved it; a new process (a new app) loads it before serving
    async with running(settings) as (app, client):
        after = (await client.post("/routes/explain", json=CODE)).json()
        assert after["adaptive"] == before["adaptive"]  # the same estimates, the same draws
        resp = await client.post("/v1/completions", json=CODE)  # its first request
        assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"
    # without the file, a fresh gateway takes the rules' choice (the speculative pool)
    fresh = Settings(state_persist=False, health_interval_s=60)
    async with running(fresh) as (app, client):
        resp = await client.post("/v1/completions", json=CODE)
        assert resp.headers["x-specgate-backend"] in {"eagle3", "ngram", "draft"}


async def test_state_is_saved_on_reload_and_periodically(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    settings = Settings(state_file=path, health_interval_s=60, state_save_interval_s=0.05)
    async with running(settings) as (app, client):
        gateway = app.state.runtime.gateway
        taught(gateway.feedback.learner, n=1)
        gateway.reload(local_config())
        for _ in range(50):
            if path.exists():
                break
            await asyncio.sleep(0.01)
        assert json.loads(path.read_text())["observations"] == len(SPEEDS)
        taught(gateway.feedback.learner, n=1)
        for _ in range(100):
            if json.loads(path.read_text())["observations"] == 2 * len(SPEEDS):
                break
            await asyncio.sleep(0.01)
        assert json.loads(path.read_text())["observations"] == 2 * len(SPEEDS)


def test_a_version_3_state_loses_the_load_bands_since_narrowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Version 3 filed 16-31, 32-63 and 64-127 requests under c16, c32 and c64; those names
    now mean 16-23, 32-47 and 64-95, so their groups are dropped on loading such a file (or
    a peer's state): c32's mixed waves of 32 and 48. The other bands keep their meaning."""
    learner = Learner(0.98)
    for band in ("", "/c8", "/c16", "/c32", "/c64", "/c128"):
        learner.observe(Observation("code", f"greedy/norep{band}", "plain", 100.0, 64))
    store = LearningStore(tmp_path / "state.json")
    data = json.loads(store.snapshot(learner) or b"")
    assert data["version"] == VERSION == 5
    data["version"] = 3
    store.path.write_text(json.dumps(data))
    restored = Learner(0.98)
    with caplog.at_level(logging.INFO, logger="gateway.learning.store"):
        assert store.load(restored)
    assert "is version 3: 3 groups of load bands since narrowed" in caplog.text
    assert sorted(b for _, b in restored.groups) == [
        "*", "greedy/norep", "greedy/norep/c128", "greedy/norep/c8"
    ]  # fmt: skip
    store.path.write_text(json.dumps(data | {"version": 4}))
    assert store.load(restored) and ("code", "greedy/norep/c32") in restored.groups


def test_a_version_4_state_is_read_at_its_geometric_mean_until_it_learns_again(
    tmp_path: Path,
) -> None:
    """Version 4 kept no tokens or seconds: its records are read at their geometric mean,
    and the first answer learnt after counts them as as many answers as long as itself."""
    learner = Learner(0.5)
    learner.observe(Observation("rag", "greedy/rep", "ngram", 100.0, 64))
    learner.observe(Observation("rag", "greedy/rep", "ngram", 400.0, 64))
    store = LearningStore(tmp_path / "state.json")
    data = json.loads(store.snapshot(learner) or b"")
    for group in data["groups"]:
        for stats in group["backends"].values():
            del stats["tokens"], stats["seconds"]
    store.path.write_text(json.dumps(data | {"version": 4}))
    restored = Learner(0.5)
    assert store.load(restored)
    old = restored.groups[("rag", "greedy/rep")].backends["ngram"]
    assert old.speed_tps == pytest.approx(math.exp((0.5 * math.log(100) + math.log(400)) / 1.5))
    restored.observe(Observation("rag", "greedy/rep", "ngram", 200.0, 32))
    new = restored.groups[("rag", "greedy/rep")].backends["ngram"]
    legacy = 0.5 * 1.5 * 32  # the old weight, aged, as answers of 32 tokens
    assert new.tokens == pytest.approx(legacy + 32)
    assert new.seconds == pytest.approx(legacy / old.speed_tps + 32 / 200)


def test_a_probe_mark_is_saved_and_shown_to_peers_at_once(tmp_path: Path) -> None:
    """A probe's mark changes the state though no answer was learnt (its answers may teach
    nothing): it is saved, and a replica sharing state routes on it at once."""
    learner = SharedLearner(0.98)
    learner.observe(Observation("code", "greedy/norep", "plain", 100.0, 64))
    store = LearningStore(tmp_path / "state.json")
    assert store.snapshot(learner) is not None and store.snapshot(learner) is None
    peer = Learner(0.98)
    peer.observe(Observation("code", "greedy/norep/c32", "plain", 80.0, 64))
    learner.set_peers(peer.groups, peer.observations)
    learner.mark_probed("code", "greedy/norep/c32", "eagle3")
    assert "eagle3" in learner.view()[("code", "greedy/norep/c32")].backends
    assert store.snapshot(learner) is not None  # the mark is a change
