"""Which backend holds a stored Response: a bounded map with a time to live.

vLLM keeps Responses API objects in the memory of the server that created them
(``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel`` and a new response's
``previous_response_id`` only work there). The gateway remembers ``id -> backend`` from each
create answer (the JSON body's ``id``, or a stream's first event, ``response.created``) and
sends the later requests for that id to that backend.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class ResponseAffinity:
    """``response id -> backend name``, at most ``max_entries`` (the oldest are forgotten
    first), each for ``ttl_s`` seconds after it was stored. ``clock`` is injectable.
    ``shared`` (replicas share it through Redis, :mod:`gateway.state.affinity`): what it
    learns is also queued in :attr:`pending` for publication (None otherwise)."""

    def __init__(
        self,
        *,
        max_entries: int = 100_000,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        shared: bool = False,
    ) -> None:
        self.max_entries, self.ttl_s, self.clock = max_entries, ttl_s, clock
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.pending: dict[str, str] | None = {} if shared else None

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, response_id: str, backend: str) -> None:
        """Record that ``backend`` holds ``response_id`` (refreshes its time to live), and
        queue it for the peers when shared."""
        self.adopt(response_id, backend)
        if self.pending is not None and len(self.pending) < self.max_entries:
            self.pending[response_id] = backend

    def adopt(self, response_id: str, backend: str) -> None:
        """Record an entry without queueing it (a peer's, read from Redis)."""
        self._entries.pop(response_id, None)
        self._entries[response_id] = (backend, self.clock() + self.ttl_s)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def backend_of(self, response_id: str) -> str | None:
        """The backend holding ``response_id``, or None (never seen, or expired)."""
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        if entry[1] < self.clock():
            del self._entries[response_id]
            return None
        return entry[0]


def response_id(payload: str | bytes) -> str | None:
    """The Response id in a create answer: a JSON body ``{"id": ...}`` or the data of a
    ``response.created`` event ``{"response": {"id": ...}}``; None when there is none."""
    try:
        data: Any = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("response"), dict):
        data = data["response"]
    rid = data.get("id")
    return rid if isinstance(rid, str) and rid else None
