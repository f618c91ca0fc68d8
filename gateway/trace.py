"""One proxied request's timeline, handed to observers (metrics, request log) when it ends."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from gateway.classify.features import RequestFeatures
    from gateway.speculation.prompt_stats import PromptStats

_USAGE_MARK = b'"completion_tokens"'
_USAGE_KEY = "completion_tokens"
logger = logging.getLogger(__name__)


def request_id_of(given: str | None) -> str:
    """A request's id: the client's ``x-request-id`` (``given``), else a new one (32 hex
    digits), which every answer and the backend's request then carry."""
    return given or os.urandom(16).hex()


class ComputeMark(NamedTuple):
    """A request's compute group at dispatch (:meth:`gateway.service.Gateway.compute_mark`).

    ``backend``: where it was dispatched; ``joined``: the requests in flight on its compute
    group then, without the group's remembered peak, this one included; ``taken``: this
    gateway's generations begun on the group so far (every member's
    :attr:`~gateway.upstream.state.BackendState.taken`); ``peer_ends``: those ended on the
    group's other servers so far (their ``ended``)."""

    backend: str
    joined: int
    taken: int
    peer_ends: int


@dataclass(slots=True)
class RequestTrace:
    """What happened to one request, in seconds from ``started`` (``time.perf_counter``).

    ``ttft_s`` is the time to the first relayed chunk (time to first token as the client
    sees it); ``gaps_s`` are the inter-chunk intervals of a stream (inter-token latency
    between relayed chunks; with speculation one chunk can carry several tokens);
    ``duration_s`` is end to end. ``usage_bytes`` keeps the last chunk that carried a
    ``usage`` object, read by :meth:`completion_tokens`. ``features``/``prompt``: what
    routing read from the request (numbers only); ``concurrency``: requests on the chosen
    backend's compute at dispatch, this one included; ``spec_decoding``: the answer's
    ``metrics.speculative_decoding`` (vLLM per-request acceptance), when it had one;
    ``shared``: another server of the backend's compute group held requests of this gateway
    when the request was dispatched, ended there meanwhile, or held some as it ended (its
    speed is not that backend's at this load: not learnt, see
    :meth:`gateway.service.Gateway.learn`); ``mark``: its compute group's counts at dispatch
    (:meth:`gateway.service.Gateway.compute_mark`), by which ``concurrency`` is lowered to what ran
    beside it and ``shared`` is set when it ends.
    Never holds prompt text.
    """

    request_id: str
    endpoint: str
    stream: bool
    started: float = field(default_factory=time.perf_counter)
    task: str | None = None
    rule: str | None = None
    backend: str | None = None
    attempts: int = 0
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    duration_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    chunks: int = 0
    usage_bytes: bytes | None = None
    features: RequestFeatures | None = None
    prompt: PromptStats | None = None
    concurrency: float = 1.0
    shared: bool = False
    mark: ComputeMark | None = None
    spec_decoding: dict[str, Any] | None = None
    _last: float | None = None
    _tokens: tuple[int | None] | None = None  # completion_tokens(), once read
    observers: list[Callable[[RequestTrace], None]] = field(default_factory=list)

    def on_chunk(self, chunk: bytes) -> None:
        """Record one chunk relayed to the client."""
        now = time.perf_counter()
        if self._last is None:
            self.ttft_s = now - self.started
        else:
            self.gaps_s.append(now - self._last)
        self._last = now
        self.chunks += 1
        if _USAGE_MARK in chunk:
            self.usage_bytes = chunk

    @contextlib.contextmanager
    def muted(self) -> Iterator[None]:
        """While in this block, :meth:`finish` records the outcome but tells no observer
        (an answer being looked at before the gateway decides to relay or retry it): after
        it, :meth:`notify` tells them, or :meth:`discard` forgets the attempt."""
        observers, self.observers = self.observers, []
        try:
            yield
        finally:
            self.observers = observers

    def notify(self) -> None:
        """Tell every observer about the finished trace (a :meth:`muted` finish); an
        observer that raises is logged and the others still run."""
        for observe in self.observers:
            try:
                observe(self)
            except Exception:  # one failing observer must not stop the others (in-flight)
                logger.exception("request trace observer %r failed", observe)

    def discard(self) -> None:
        """Forget an attempt thrown away (a refusal retried elsewhere): open again, its
        outcome and chunk timings cleared."""
        self.duration_s = self.status = self.error = None
        self.ttft_s, self._last, self.usage_bytes, self.spec_decoding = None, None, None, None
        self.gaps_s, self.chunks = [], 0

    def finish(self, status: int, error: str | None = None) -> None:
        """Close the trace (once) and hand it to every observer; an observer that raises is
        logged and the others still run."""
        if self.duration_s is not None:
            return
        self.duration_s = time.perf_counter() - self.started
        self.status, self.error = status, error
        self.notify()

    def completion_tokens(self) -> int | None:
        """``usage.completion_tokens`` from the response (None when it carried no usage);
        parsed once, when the trace is finished (observers each ask)."""
        if self._tokens is not None and self.duration_s is not None:
            return self._tokens[0]
        tokens = self._parse_tokens()
        if self.duration_s is not None:
            self._tokens = (tokens,)
        return tokens

    def _parse_tokens(self) -> int | None:
        raw = self.usage_bytes
        if raw is None:
            return None
        for part in raw.split(b"\n"):
            part = part.removeprefix(b"data: ").strip()
            if _USAGE_MARK not in part:
                continue
            try:
                usage = _usage_object(part)
                if usage is None:
                    usage = json.loads(part).get("usage") or {}
                return int(usage["completion_tokens"])
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
                return None  # e.g. "completion_tokens": 1e999
        return None


_DECODER = json.JSONDecoder()


def _usage_object(part: bytes) -> dict[str, Any] | None:
    """The ``usage`` object of a JSON answer read on its own (the answer's last ``"usage":``
    key, where vLLM puts it), without decoding the whole answer; None when it is not found
    that way (the caller then decodes all of it)."""
    at = part.rfind(b'"usage":')
    if at <= 0 or part[at - 1 : at] == b"\\":
        return None
    text = part[at + 8 :].decode("utf-8", "replace")
    try:
        value, _ = _DECODER.raw_decode(text, len(text) - len(text.lstrip()))
    except ValueError:
        return None
    return value if isinstance(value, dict) and _USAGE_KEY in value else None
