"""How the upstream layer reports a request its backends could not serve.

``gateway.upstream`` raises only these (and its client's own errors,
:mod:`gateway.upstream.client`); it never chooses an HTTP status or writes an error body.
A leaf module of their own, so that ``gateway.errors`` and ``gateway.upstream`` both read
them without depending on each other. :func:`gateway.errors.from_upstream`
maps each to the client's status and OpenAI envelope, and
:func:`gateway.errors.stream_failure_event` renders the SSE events that end a stream that
failed part-way, in the shape of the API the client called (the forwarder is handed that
renderer, :class:`StreamFailureRenderer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class UpstreamFailure(Exception):
    """A request the backends could not serve."""


class NoBackendAnswered(UpstreamFailure):
    """Every backend tried failed before answering, or there was none to try."""


class BackendTimedOut(UpstreamFailure):
    """The chosen backend sent no response headers within the first-byte timeout (not
    retried elsewhere: the request may be running there)."""


class AnswerBroken(UpstreamFailure):
    """A non-streamed answer broke off part-way (reset, or a gap past the idle timeout)."""


@dataclass
class BackendDied(UpstreamFailure):
    """The backend died with this request in flight (:mod:`gateway.upstream.deaths`):
    ``signal`` is how the death showed, ``blame`` the quarantine's verdict on the request
    (``quarantined``, ``suspect`` or ``none``), ``in_flight`` the requests there at the
    death, ``ttl_s`` how long a quarantined request is refused (seconds)."""

    backend: str
    signal: str
    blame: str
    in_flight: int
    ttl_s: float


#: Renders the bytes that end a stream whose backend failed part-way, from the death (None:
#: it broke off) and the request's path (what says which API's error shape the client
#: reads), as :func:`gateway.errors.stream_failure_event` does.
StreamFailureRenderer = Callable[[BackendDied | None, str], bytes]
