"""Opt-in prompt capture (config ``capture:``): what a record holds and never holds, the
bounded dataset on disk (rotation, total cap, modes), and that capture never costs a request
(full queue, unwritable directory)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from contracts.capture_store import CaptureStore, capture_files
from contracts.config import CaptureSettings, ConfigError, GatewayConfig, parse_config
from gateway.telemetry.capture import Capture, CaptureMetrics, QueueBounds
from tests.unit.conftest import MODEL, gateway_settings, in_process, local_config

SECRET = "sk-client-secret-4242"
CHAT = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Explain what a hash map is."},
    ],
    "temperature": 0.7,
    "max_tokens": 8,
    "user": "alice@example.com",
    "metadata": {"team": "payments"},
}
COMPLETION = {"model": MODEL, "prompt": "def fib(n):\n    ", "max_tokens": 8, "temperature": 0}


def capture_config(directory: Path, **fields: Any) -> GatewayConfig:
    """The local config with capture on into ``directory``."""
    capture = CaptureSettings(enabled=True, dir=directory, **fields)
    return local_config().model_copy(update={"capture": capture})


def records(directory: Path) -> list[dict[str, Any]]:
    """Every captured record under ``directory``, oldest file first."""
    out = []
    for f in capture_files(directory):
        out += [json.loads(line) for line in f.path.read_text().splitlines()]
    return out


def all_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if p.is_file())


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def metric(app: Any, name: str, labels: dict[str, str]) -> float:
    value = app.state.runtime.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


async def test_capture_is_off_by_default_and_writes_nothing(tmp_path: Path) -> None:
    assert local_config().capture.enabled is False
    async with in_process(gateway_settings(cache_dir=tmp_path)) as gw:
        resp = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code == 200
        await gw.client.post("/v1/completions", json=COMPLETION)
    # The cache dir holds only the adaptive policy's learnt state (state/), no capture.
    assert "capture" not in listing(tmp_path)
    assert not [name for name in all_files(tmp_path) if name.endswith(".jsonl")]


async def test_default_dir_is_under_the_cache_dir(tmp_path: Path) -> None:
    config = local_config().model_copy(update={"capture": CaptureSettings(enabled=True)})
    async with in_process(gateway_settings(cache_dir=tmp_path), config) as gw:
        await gw.client.post("/v1/completions", json=COMPLETION)
    assert [r["prompt"] for r in records(tmp_path / "capture")] == [COMPLETION["prompt"]]


async def test_records_hold_the_prompt_task_endpoint_and_time_only(tmp_path: Path) -> None:
    directory = tmp_path / "cap"
    async with in_process(gateway_settings(), capture_config(directory)) as gw:
        chat = await gw.client.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={"authorization": f"Bearer {SECRET}", "x-task-type": "chat"},
        )
        completion = await gw.client.post(
            "/v1/completions", json=COMPLETION, headers={"x-task-type": "code"}
        )
        assert chat.status_code == completion.status_code == 200
    # written on shutdown at the latest (the lifespan flushes the queue)
    chat_record, completion_record = sorted(records(directory), key=lambda r: r["endpoint"])
    assert set(chat_record) == {"ts", "endpoint", "task", "messages"}
    assert chat_record["endpoint"] == "/v1/chat/completions"
    assert chat_record["task"] == "chat"
    assert chat_record["messages"] == CHAT["messages"]
    assert chat_record["ts"].endswith("Z")
    assert set(completion_record) == {"ts", "endpoint", "task", "prompt"}
    assert completion_record["prompt"] == COMPLETION["prompt"]
    assert completion_record["task"] == "code"
    raw = b"".join(f.path.read_bytes() for f in capture_files(directory))
    answer = chat.json()["choices"][0]["message"]["content"]
    for never in (SECRET, "Bearer", answer, " w0", "alice", "payments", "max_tokens", "127.0"):
        assert never.encode() not in raw
    assert gw.app.state.runtime.metrics.registry.get_sample_value(
        "specgate_capture_records_total", {"task": "chat"}
    ) == pytest.approx(1)


async def test_streaming_requests_are_captured(tmp_path: Path) -> None:
    directory = tmp_path / "cap"
    body = CHAT | {"stream": True}
    async with in_process(gateway_settings(), capture_config(directory)) as gw:
        resp = await gw.client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200
        assert resp.text.rstrip().endswith("data: [DONE]")
    [record] = records(directory)
    assert record["messages"] == CHAT["messages"]
    assert "stream" not in record


async def test_tasks_and_sample_select_what_is_recorded(tmp_path: Path) -> None:
    only_code = capture_config(tmp_path / "code", tasks=["code"])
    async with in_process(gateway_settings(), only_code) as gw:
        await gw.client.post("/v1/chat/completions", json=CHAT, headers={"x-task-type": "chat"})
        await gw.client.post("/v1/completions", json=COMPLETION, headers={"x-task-type": "code"})
    assert [r["task"] for r in records(tmp_path / "code")] == ["code"]
    never = capture_config(tmp_path / "none", sample=0.0)
    async with in_process(gateway_settings(), never) as gw:
        await gw.client.post("/v1/completions", json=COMPLETION)
    assert not (tmp_path / "none").exists()


async def test_files_and_directory_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "cap"
    async with in_process(gateway_settings(), capture_config(directory)) as gw:
        await gw.client.post("/v1/completions", json=COMPLETION)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    [captured] = capture_files(directory)
    assert stat.S_IMODE(captured.path.stat().st_mode) == 0o600


async def test_unwritable_dir_answers_200_and_counts_the_error_once_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    config = capture_config(blocker / "capture")
    with caplog.at_level(logging.ERROR, logger="gateway.telemetry.capture"):
        async with in_process(gateway_settings(), config) as gw:
            for _ in range(3):
                resp = await gw.client.post("/v1/completions", json=COMPLETION)
                assert resp.status_code == 200
                await gw.app.state.runtime.capture.flush()
            app = gw.app
    errors = sum(
        s.value
        for m in app.state.runtime.metrics.registry.collect()
        if m.name == "specgate_capture_errors"
        for s in m.samples
        if s.name.endswith("_total")
    )
    assert errors == 3
    assert metric(app, "specgate_capture_dropped_total", {"reason": "write_error"}) == 3
    logged = [r for r in caplog.records if r.name == "gateway.telemetry.capture"]
    assert len(logged) == 1
    assert "cannot write" in logged[0].getMessage()
    assert COMPLETION["prompt"] not in caplog.text


async def test_a_full_queue_drops_and_counts(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    store = CaptureStore(tmp_path / "cap", max_bytes=1 << 20, max_file_bytes=1 << 16)
    settings = CaptureSettings(enabled=True, dir=tmp_path / "cap")
    capture = Capture(lambda: settings, store, CaptureMetrics(registry), bounds=QueueBounds(2, 100))
    body = {"prompt": "x"}
    for _ in range(3):  # no writer running: the queue fills
        capture.offer("/v1/completions", "code", body, 10)
    capture.offer("/v1/completions", "code", body, 95)  # past the byte bound
    assert len(capture.pending) == 2
    dropped = registry.get_sample_value("specgate_capture_dropped_total", {"reason": "queue_full"})
    assert dropped == 2
    assert not (tmp_path / "cap").exists()  # nothing is written on the request path


def test_store_rotates_files_and_keeps_the_total_under_the_cap(tmp_path: Path) -> None:
    ticks = iter(range(1_000_000, 2_000_000))
    root = tmp_path / "cap"
    store = CaptureStore(root, max_bytes=250, max_file_bytes=100, clock=lambda: next(ticks))
    line = b'{"prompt":"' + b"x" * 26 + b'"}\n'  # 40 bytes
    assert len(line) == 40
    seen: list[Path] = []
    for i in range(12):
        store.begin()
        store.append("code" if i % 3 else "chat", line)
        files = capture_files(root)
        seen += [f.path for f in files if f.path not in seen]
        assert sum(f.size for f in files) <= 250
        assert all(f.size <= 100 for f in files)
    files = capture_files(root)
    assert sum(f.size for f in files) == 240  # six lines: the seventh would pass 250
    assert {f.task for f in files} == {"code", "chat"}
    # rotated: two 40-byte lines per 100-byte file; the oldest files were deleted first
    assert len(seen) > len(files)
    assert [p for p in seen if p.exists()] == [f.path for f in files]
    assert seen[-len(files) :] == [f.path for f in files]
    assert all(stat.S_IMODE(f.path.stat().st_mode) == 0o600 for f in files)


def test_store_leaves_other_files_and_notices_deleted_ones(tmp_path: Path) -> None:
    root = tmp_path / "cap"
    store = CaptureStore(root, max_bytes=100, max_file_bytes=100)
    store.begin()
    (root / "notes.txt").write_text("mine\n" * 100)
    store.append("rag", b"a" * 60 + b"\n")
    [first] = capture_files(root)
    first.path.unlink()  # deleted by hand while the gateway runs
    store.begin()
    store.append("rag", b"b" * 60 + b"\n")
    store.append("rag", b"c" * 60 + b"\n")  # rotates, and the cap removes the older file
    [last] = capture_files(root)
    assert last.path.read_bytes() == b"c" * 60 + b"\n"
    assert (root / "notes.txt").stat().st_size == 500


def test_a_record_larger_than_a_file_is_dropped(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    store = CaptureStore(tmp_path / "cap", max_bytes=4096, max_file_bytes=1024)
    settings = CaptureSettings(enabled=True)
    capture = Capture(lambda: settings, store, CaptureMetrics(registry), rng=random.Random(0))
    capture.offer("/v1/completions", "code", {"prompt": "y" * 2000}, 2020)
    capture.offer("/v1/completions", "code", {"prompt": "short"}, 20)
    capture.write(capture.pending)
    assert [r["prompt"] for r in records(tmp_path / "cap")] == ["short"]
    assert registry.get_sample_value("specgate_capture_dropped_total", {"reason": "too_large"}) == 1


@pytest.mark.parametrize(
    ("capture", "problem"),
    [
        ({"max_bytes": 4096, "max_file_bytes": 8192}, "max_file_bytes must not exceed"),
        ({"tasks": ["code", "poetry"]}, "capture.tasks.1"),
        ({"sample": 1.5}, "capture.sample"),
        ({"enabled": True, "outputs": True}, "capture.outputs"),
        ({"enabled": True, "dir": ""}, "dir must name a folder"),
    ],
)
def test_capture_config_is_validated(capture: dict[str, Any], problem: str) -> None:
    data = local_config().model_dump(mode="json", exclude_none=True) | {"capture": capture}
    with pytest.raises(ConfigError, match=problem):
        parse_config(data, "test.yaml")


async def test_a_hung_disk_at_shutdown_stops_the_writer_and_counts_what_was_lost(
    tmp_path: Path,
) -> None:
    """Shutdown waits ``timeout_s`` for the writer, then goes: the queued prompts and the
    rest of the batch the worker thread holds are counted as ``shutdown`` drops, and the
    thread writes nothing after the app has stopped."""
    release = threading.Event()
    appended: list[str] = []

    class HungStore(CaptureStore):
        def append(self, task: str, line: bytes) -> None:
            release.wait(5)  # the first line hangs (say, an NFS server gone)
            appended.append(task)

    registry = CollectorRegistry()
    capture = Capture(
        lambda: CaptureSettings(enabled=True),
        HungStore(tmp_path, 10**9, 10**8),
        CaptureMetrics(registry),
    )
    task = asyncio.create_task(capture.run())
    for _ in range(3):
        capture.offer("/v1/completions", "code", COMPLETION, 100)
    await asyncio.sleep(0.05)  # the writer took the batch of 3 and hangs on its first line
    for _ in range(2):
        capture.offer("/v1/completions", "code", COMPLETION, 100)  # queued behind it
    await capture.aclose(task, timeout_s=0.1)
    dropped = {"reason": "shutdown"}
    assert registry.get_sample_value("specgate_capture_dropped_total", dropped) == 2
    release.set()  # the disk comes back after the app stopped
    for _ in range(100):
        if registry.get_sample_value("specgate_capture_dropped_total", dropped) == 4:
            break
        await asyncio.sleep(0.01)
    # the line already in the hung call lands; the other two of its batch are not written
    assert appended == ["code"]
    assert registry.get_sample_value("specgate_capture_dropped_total", dropped) == 4
