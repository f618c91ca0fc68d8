"""Opt-in capture of routed requests' prompts, the data ``specgate drafts train
--from-capture`` learns draft heads from (config ``capture:``, off by default).

A record is the prompt as the client sent it (chat ``messages``, completions ``prompt``,
Responses ``instructions``/``input``, Anthropic ``system``/``messages``), the classified task,
the endpoint and a UTC timestamp; nothing else of the request (no output, keys, headers,
addresses or sampling fields). The request path only appends a reference to a bounded
in-memory queue (:meth:`Capture.offer`, no I/O, no serialization); a background task hands
batches to a worker thread that serializes and writes them (:mod:`contracts.capture_store`).
A full queue drops the record, a disk error is logged once and the batch dropped, each
counted in ``specgate_capture_dropped_total``; neither ever reaches the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from contracts.capture_store import CaptureStore
from contracts.config import CaptureSettings
from contracts.paths import CachePaths, default_cache_dir
from gateway.service import Gateway
from gateway.settings import Settings
from gateway.telemetry.metrics import GatewayMetrics

logger = logging.getLogger(__name__)

#: The body fields that make up the prompt, per routed endpoint.
PROMPT_FIELDS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("messages",),
    "/v1/completions": ("prompt",),
    "/v1/responses": ("instructions", "input"),
    "/v1/messages": ("system", "messages"),
}


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """The queue's bounds: records waiting, and their request bodies' bytes."""

    records: int = 1024
    bytes: int = 32 * 1024 * 1024


#: Seconds shutdown waits for the queue to be written.
FLUSH_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Pending:
    """A record waiting to be written: its fields reference the parsed body, not copies."""

    at: float
    endpoint: str
    task: str
    prompt: dict[str, Any]
    size: int


class CaptureMetrics:
    """The capture's counters, on the app's metrics registry (thread-safe increments)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.records = Counter(
            "specgate_capture_records",
            "Prompts written to the capture dataset, by task.",
            ("task",),
            registry=registry,
        )
        self.dropped = Counter(
            "specgate_capture_dropped",
            "Prompts not captured: queue_full, too_large (over max_file_bytes), "
            "write_error (lost to a disk error), shutdown (not flushed in time), "
            "unserializable, internal_error.",
            ("reason",),
            registry=registry,
        )
        self.errors = Counter(
            "specgate_capture_errors", "Disk errors while writing captured prompts.", ("kind",),
            registry=registry,
        )  # fmt: skip


class Capture:
    """The request-side queue and its writer; ``settings`` is read per request (a reload
    changes ``enabled``, ``tasks`` and ``sample``), ``store`` is fixed at start."""

    def __init__(
        self,
        settings: Callable[[], CaptureSettings],
        store: CaptureStore,
        metrics: CaptureMetrics,
        *,
        bounds: QueueBounds = QueueBounds(),
        rng: random.Random | None = None,
    ) -> None:
        self.settings, self.store, self.metrics, self.bounds = settings, store, metrics, bounds
        self.rng = rng or random.Random()
        self.pending: list[Pending] = []
        self.pending_bytes = 0  # of the queue and of the batch being written
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._abandoned = False  # shutdown gave up waiting: the writer thread stops early
        self._failing = False

    def offer(self, endpoint: str, task: str, body: Mapping[str, Any], size: int) -> None:
        """Queue the prompt of a routed request (``size``: its body's bytes) when capture is
        on for ``task``; never blocks, never raises for a full queue."""
        settings = self.settings()
        if not settings.enabled or self._closing or task not in settings.tasks:
            return
        if settings.sample < 1 and self.rng.random() >= settings.sample:
            return
        prompt = {k: body[k] for k in PROMPT_FIELDS.get(endpoint, ()) if k in body}
        if not prompt:
            return
        if len(self.pending) >= self.bounds.records or (
            self.pending_bytes + size > self.bounds.bytes
        ):
            self.metrics.dropped.labels("queue_full").inc()
            return
        self.pending.append(Pending(time.time(), endpoint, task, prompt, size))
        self.pending_bytes += size
        self._idle.clear()
        self._wake.set()

    async def run(self) -> None:
        """Write queued records in batches in a worker thread, until :meth:`aclose`."""
        while True:
            if not self.pending:
                self._idle.set()
                if self._closing:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            batch, self.pending = self.pending, []
            try:
                await asyncio.to_thread(self.write, batch)
            except Exception:  # a bug must not stop capture (nor ever reach a request)
                logger.exception("capture: a batch of %d prompts was lost", len(batch))
                self.metrics.dropped.labels("internal_error").inc(len(batch))
            finally:
                self.pending_bytes -= sum(p.size for p in batch)

    async def flush(self) -> None:
        """Wait until every queued record has been written (or dropped); needs :meth:`run`."""
        await self._idle.wait()

    async def aclose(self, task: asyncio.Task[None], timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Refuse new records, write the queued ones (flush) and stop ``task`` (:meth:`run`);
        what is not written within ``timeout_s`` is dropped and counted as ``shutdown``: the
        queue here, the rest of a batch the worker thread is on by the thread itself (it
        stops before its next line; a line already handed to a hung disk may still land)."""
        self._closing = True
        self._wake.set()
        try:
            await asyncio.wait_for(task, timeout_s)
        except TimeoutError:  # a hung disk (say, NFS) must not hold the shutdown
            self._abandoned = True
            self.metrics.dropped.labels("shutdown").inc(len(self.pending))
            logger.warning(
                "capture: %d queued prompts not written at shutdown (and the rest of the "
                "batch being written)",
                len(self.pending),
            )

    def write(self, batch: list[Pending]) -> None:
        """Serialize and store one batch (worker thread). A disk error drops the rest of the
        batch, counted, and is logged once until a write succeeds again."""
        lines = []
        for item in batch:
            try:
                line = _line(item)
            except (ValueError, RecursionError):  # e.g. nesting json.loads took, dumps not
                self.metrics.dropped.labels("unserializable").inc()
                continue
            if self.store.fits(line):
                lines.append((item.task, line))
            else:
                self.metrics.dropped.labels("too_large").inc()
        written = 0
        try:
            if lines:
                self.store.begin()
            for task, line in lines:
                if self._abandoned:  # the app has stopped: write nothing more
                    self.metrics.dropped.labels("shutdown").inc(len(lines) - written)
                    return
                self.store.append(task, line)
                written += 1
                self.metrics.records.labels(task).inc()
        except OSError as exc:
            self.metrics.errors.labels(type(exc).__name__).inc()
            self.metrics.dropped.labels("write_error").inc(len(lines) - written)
            if not self._failing:
                logger.error("capture: cannot write to %s: %s", self.store.root, exc)
            self._failing = True
            return
        if self._failing and written:
            logger.info("capture: writing to %s again", self.store.root)
            self._failing = False


def _line(item: Pending) -> bytes:
    """One JSONL line: ``ts``, ``endpoint``, ``task``, then the prompt fields (ASCII)."""
    when = datetime.fromtimestamp(item.at, UTC).isoformat(timespec="milliseconds")
    record = {"ts": when.replace("+00:00", "Z"), "endpoint": item.endpoint, "task": item.task}
    return (json.dumps(record | item.prompt, separators=(",", ":")) + "\n").encode()


@contextlib.asynccontextmanager
async def capture_lifespan(
    gateway: Gateway, settings: Settings, metrics: GatewayMetrics
) -> AsyncIterator[Capture]:
    """A :class:`Capture` (its counters on ``metrics``' registry) whose writer runs until
    the block exits, then flushes (drained, not cancelled). Nothing touches the disk until
    capture is on and a prompt is recorded."""
    config = gateway.config.capture  # its dir, else capture/ under the cache dir
    folder = config.dir.expanduser() if config.dir is not None else None
    folder = folder or CachePaths(settings.cache_dir or default_cache_dir()).capture
    store = CaptureStore(folder, config.max_bytes, config.max_file_bytes)
    capture = Capture(lambda: gateway.config.capture, store, CaptureMetrics(metrics.registry))
    task = asyncio.create_task(capture.run(), name="specgate-capture")
    try:
        yield capture
    finally:
        await capture.aclose(task)
