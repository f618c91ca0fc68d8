"""What each backend serves, read from the backend itself: its paths (``/openapi.json``) and
its model cards (``/v1/models``), cached for ``ttl_s`` seconds.

Read on demand (the first request that needs it after the cache expired waits for one
round of ``GET``s, all backends at once, each bounded by ``timeout_s``); a backend that fails
keeps its last good answer. Built in ``create_app``'s lifespan.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from contracts.config import BackendConfig
from gateway.upstream.endpoints import PathTemplate, openapi_templates

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Entry:
    expires: float = 0.0
    paths: list[PathTemplate] = field(default_factory=list)
    cards: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class BackendCatalog:
    """Backends' paths and model cards (see the module docstring)."""

    client: httpx.AsyncClient
    ttl_s: float = 60.0
    timeout_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def refresh(self, backends: Mapping[str, BackendConfig], names: Iterable[str]) -> None:
        """Re-read the backends in ``names`` whose entry expired (concurrently)."""
        async with self._lock:
            now = self.clock()
            stale = [n for n in names if self._entries.setdefault(n, _Entry()).expires <= now]
            if stale:
                await asyncio.gather(*(self._read(n, backends[n]) for n in stale))

    async def _read(self, name: str, backend: BackendConfig) -> None:
        entry = self._entries[name]
        headers = {"authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
        try:
            schema, models = await asyncio.gather(
                self._get(backend.base_url + "/openapi.json", headers),
                self._get(backend.base_url + "/v1/models", headers),
            )
        except (httpx.HTTPError, ValueError) as exc:
            logger.info("catalog: %s unreadable (%s); keeping its last answer", name, exc)
            return
        entry.paths = openapi_templates(schema) or entry.paths
        data = models.get("data") if isinstance(models, dict) else None
        if isinstance(data, list):
            entry.cards = [card for card in data if isinstance(card, dict)]
        entry.expires = self.clock() + self.ttl_s

    async def _get(self, url: str, headers: dict[str, str]) -> Any:
        response = await self.client.get(url, headers=headers, timeout=self.timeout_s)
        response.raise_for_status()
        return response.json()

    def paths(self, name: str) -> list[PathTemplate]:
        """The paths backend ``name`` listed last (empty before its first answer)."""
        return self._entries.get(name, _Entry()).paths

    def cards(self, name: str) -> list[dict[str, Any]]:
        """The model cards backend ``name`` listed last."""
        return self._entries.get(name, _Entry()).cards


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
