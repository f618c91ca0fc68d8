"""What each backend serves, read from the backend itself: its paths (``/openapi.json``) and
its model cards (``/v1/models``), cached for ``ttl_s`` seconds.

Read ahead for every available backend (:meth:`BackendCatalog.warm`, a background loop of
the app) and on demand: one read per backend in flight however many requests ask, each
bounded by ``timeout_s``. Only a backend whose first read has not ended makes a request wait
(for its first answer or failure, once); one with an answer, or whose first read failed,
keeps what it has while its re-read runs, so a hung backend delays no ``/v1/models`` and no
relayed path (each request waited ``timeout_s`` behind the one before it when a lock held
the reads). A backend that fails keeps its last good answer and is asked again ``retry_s``
later. Built in ``create_app``'s lifespan, which closes it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from contracts.config import BackendConfig
from gateway.upstream.endpoints import PathTemplate, openapi_templates
from gateway.upstream.state import BackendRegistry

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Entry:
    expires: float = 0.0
    tried: bool = False  # a read ended (answered or failed): callers no longer wait for one
    answered: bool = False  # a read ever got an HTTP answer (2xx or not)
    failing: bool = False  # the last read failed (logged once a streak, at info)
    paths: list[PathTemplate] = field(default_factory=list)
    cards: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class BackendCatalog:
    """Backends' paths and model cards (see the module docstring). ``ttl_s``: seconds an
    answer is kept; ``timeout_s``: bound on one read; ``retry_s``: seconds before a backend
    that failed is read again."""

    client: httpx.AsyncClient
    ttl_s: float = 60.0
    timeout_s: float = 5.0
    retry_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _reads: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _available: frozenset[str] = frozenset()  # the backends :meth:`warm` saw available last

    async def refresh(
        self, backends: Mapping[str, BackendConfig], names: Iterable[str], *, wait: bool = False
    ) -> None:
        """Start a read of each backend in ``names`` whose entry expired (none already in
        flight); wait only for first reads (a backend never read yet), or (``wait``) for
        every read in flight among them (a path none of them listed: it may be new)."""
        waits = [
            asyncio.shield(read)  # a caller that leaves stops no read
            for entry, read in self._start(backends, names)
            if wait or not entry.tried
        ]
        if waits:
            await asyncio.gather(*waits)

    async def warm(self, backends: Mapping[str, BackendConfig], registry: BackendRegistry) -> None:
        """Read every available backend whose entry expired, waiting for first reads only
        (:meth:`refresh`): once in the app's startup, then its ``specgate-catalog`` loop
        every health interval. A client's first ``/v1/models`` or relayed path then finds
        the answers read, where it waited for the backends' first ``/openapi.json`` (2.0-3.0
        s on the CPU stack, session 44). A backend available again since the last call (a
        server restarted, perhaps with other arguments: its ``max_model_len``, its paths) is
        read now, not when the dead server's answer expires (up to ``ttl_s`` later)."""
        available = registry.available()
        for name in set(available) - self._available:
            if name in self._entries and name not in self._reads:
                self._entries[name].expires = 0.0
        self._available = frozenset(available)
        await self.refresh(backends, available)

    def _start(
        self, backends: Mapping[str, BackendConfig], names: Iterable[str]
    ) -> list[tuple[_Entry, asyncio.Task[None]]]:
        """The reads in flight for ``names``, one started for each expired entry."""
        now, reads = self.clock(), []
        for name in names:
            entry = self._entries.setdefault(name, _Entry())
            read = self._reads.get(name)
            if read is None and entry.expires <= now:
                read = asyncio.create_task(self._read(name, backends[name]))
                self._reads[name] = read
                read.add_done_callback(functools.partial(self._forget, name))
            if read is not None:
                reads.append((entry, read))
        return reads

    def _forget(self, name: str, read: asyncio.Task[None]) -> None:
        if self._reads.get(name) is read:
            del self._reads[name]

    async def _read(self, name: str, backend: BackendConfig) -> None:
        entry = self._entries[name]
        headers = {"authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
        try:
            schema, models = await asyncio.gather(
                self._get(backend.base_url + "/openapi.json", headers),
                self._get(backend.base_url + "/v1/models", headers),
            )
        except (httpx.HTTPError, ValueError) as exc:
            entry.tried = True
            # an answer, even an error or no JSON (vLLM's --disable-fastapi-docs has no
            # /openapi.json), is a backend reached; a refused or timed-out read is not
            entry.answered |= not isinstance(exc, httpx.TransportError)
            level = logging.DEBUG if entry.failing else logging.INFO  # the loop re-reads
            logger.log(level, "catalog: %s unreadable (%r); keeping its last answer", name, exc)
            entry.failing = True
            entry.expires = self.clock() + min(self.retry_s, self.ttl_s)
            return
        except Exception:  # never expected: a read nobody awaits must not fail unseen
            entry.tried = entry.failing = True
            logger.exception("catalog: reading %s failed; keeping its last answer", name)
            entry.expires = self.clock() + min(self.retry_s, self.ttl_s)
            return
        if entry.failing:
            logger.info("catalog: %s readable again", name)
        entry.failing = False
        entry.paths = openapi_templates(schema) or entry.paths
        data = models.get("data") if isinstance(models, dict) else None
        if isinstance(data, list):
            entry.cards = [card for card in data if isinstance(card, dict)]
        entry.tried = entry.answered = True
        entry.expires = self.clock() + self.ttl_s

    async def _get(self, url: str, headers: dict[str, str]) -> Any:
        response = await self.client.get(url, headers=headers, timeout=self.timeout_s)
        response.raise_for_status()
        return response.json()

    def paths(self, name: str) -> list[PathTemplate]:
        """The paths backend ``name`` listed last (empty before its first answer)."""
        return self._entries.get(name, _Entry()).paths

    def answered(self, name: str) -> bool:
        """Whether backend ``name`` was ever reached: a read got an HTTP answer, 2xx or
        not (its paths may still be empty); False while every read was refused or timed out."""
        return self._entries.get(name, _Entry()).answered

    def cards(self, name: str) -> list[dict[str, Any]]:
        """The model cards backend ``name`` listed last."""
        return self._entries.get(name, _Entry()).cards

    async def aclose(self) -> None:
        """Cancel the reads in flight and wait for them (idempotent)."""
        reads = list(self._reads.values())
        for read in reads:
            read.cancel()
        await asyncio.gather(*reads, return_exceptions=True)


def merge_cards(
    served: Iterable[str], cards_by_backend: Mapping[str, list[dict[str, Any]]], created: int
) -> list[dict[str, Any]]:
    """One card per served model name: the first backend's card as vLLM wrote it
    (``root``, ``parent``, ``permission``...), ``max_model_len`` the smallest of every
    backend serving the name (a client sizing its context by it fits on any of them); a
    name no backend described gets a minimal card."""
    out = []
    for name in served:
        cards = [c for cs in cards_by_backend.values() for c in cs if c.get("id") == name]
        if not cards:
            out.append({"id": name, "object": "model", "created": created, "owned_by": "specgate"})
            continue
        card = dict(cards[0])
        lengths = [c["max_model_len"] for c in cards if isinstance(c.get("max_model_len"), int)]
        if lengths:
            card["max_model_len"] = min(lengths)
        out.append(card)
    return out
