"""Per-request feedback read from a backend's answer while it is relayed.

A vLLM server started with ``--per-request-spec-decode-metrics summary`` adds
``metrics.speculative_decoding`` (``num_draft_tokens``, ``num_accepted_draft_tokens``,
``num_spec_steps``, ``draft_acceptance_rate``, ``mean_acceptance_length``,
``acceptance_histogram``, ...) to each single-sequence answer (``n == 1``; vLLM
``SpeculativeDecodingMetrics``). In a JSON answer it is the last top-level field; in a stream
it rides on the final usage chunk (``"choices":[]``), which vLLM only sends when the client
asked for ``stream_options.include_usage``.

So for a stream whose client did not ask, :func:`with_usage` asks upstream, and
:class:`ResponseTap` removes that chunk before the client sees it. vLLM also moves the
``system_fingerprint`` from each terminal content chunk to the usage chunk when usage is on;
the fingerprint is a constant of the server (``--fingerprint-mode``), so the tap learns it
per backend from the answers it relays (:attr:`BackendState.fingerprint`) and stamps it on
each terminal chunk as that chunk passes: the client's bytes are exactly those it would have
had, and no chunk waits for another (a completions stream of several prompts sends each
choice's terminal chunk long before the usage chunk). Usage is only asked for once the
fingerprint of the decision's first backend is known (:func:`fingerprints_known`); until then
a stream is relayed as the client asked, which teaches the fingerprint. A stream that fails
over before its first byte to a backend whose fingerprint is not known yet loses the
``system_fingerprint`` of its terminal chunk (it was on the removed usage chunk). (vLLM's own
``--enable-force-include-usage`` is no alternative: it forces *continuous* usage, a ``usage``
object on every chunk.)

Hot path: the relay only scans each chunk for two short markers; JSON is parsed once, for
the final usage chunk (or the tail of a JSON answer) only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gateway.trace import RequestTrace
from gateway.upstream.state import BackendRegistry

logger = logging.getLogger(__name__)

_USAGE = b'"usage":{'
_FINISH = b'"finish_reason":"'
_FINGERPRINT = b'"system_fingerprint":'
_INJECTED = b'"stream_options":{"include_usage":true},'
_BOOL = TypeAdapter(bool)
#: The endpoints (as ``RequestTrace.endpoint``) whose answers carry vLLM's fingerprint.
_FINGERPRINTED = frozenset({"completions", "chat/completions"})


def with_usage(raw: bytes, body: Mapping[str, Any]) -> bytes | None:
    """The body to send upstream so a stream ends with a usage chunk, or None to send
    ``raw`` as it is (not a stream, ``n > 1`` (vLLM reports no per-request metrics then),
    or the client asked for usage itself, or the body is not UTF-8).

    Without ``stream_options`` the field is spliced in after the opening brace (the rest of
    the client's bytes untouched); otherwise the object is re-serialized with
    ``include_usage: true`` and ``continuous_usage_stats: false`` (continuous usage only
    ever applies with ``include_usage``, so the client's answer does not change).
    """
    if body.get("stream") is not True or body.get("n") not in (None, 1):
        return None
    if json.detect_encoding(raw) != "utf-8":
        return None  # UTF-16/32 JSON (or a BOM): left as the client sent it
    options = body.get("stream_options")
    if "stream_options" not in body:
        at = raw.find(b"{") + 1
        return raw[:at] + _INJECTED + raw[at:]
    if options is not None and not isinstance(options, Mapping):
        return None  # malformed: the backend answers the client's own body
    if options is not None and options.get("include_usage") is not None:
        try:  # vLLM reads it as a pydantic bool: 1, "true", "yes" are true too
            if _BOOL.validate_python(options["include_usage"]):
                return None
        except ValidationError:
            return None  # the backend rejects the client's own body
    forced = {**(options or {}), "include_usage": True, "continuous_usage_stats": False}
    # ASCII escapes: equal JSON, and a lone surrogate ("\ud800") stays encodable
    return json.dumps({**body, "stream_options": forced}).encode()


def _parse_line(line: bytes) -> dict[str, Any] | None:
    """The JSON object of one SSE ``data:`` line, or None."""
    try:
        data = json.loads(line.removeprefix(b"data:").strip())
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _final_usage(line: bytes) -> dict[str, Any] | None:
    """The parsed line if it is the final usage chunk (usage, no choices), else None."""
    data = _parse_line(line) if _USAGE in line else None
    return data if data is not None and not data.get("choices") else None


def fingerprints_known(registry: BackendRegistry, backends: Iterable[str]) -> bool:
    """Whether every one of ``backends`` has taught its ``system_fingerprint`` (or that it
    sends none): only then may a stream's usage chunk be asked for and removed."""
    states = registry.states
    return all(
        (state := states.get(b)) is not None and state.fingerprint is not None for b in backends
    )


class ResponseTap:
    """Sits in the relay of one successful answer: records its usage and
    ``metrics.speculative_decoding`` on ``trace`` (``usage_bytes``, ``spec_decoding``) and
    the backend's ``system_fingerprint`` in ``registry`` (the backend is ``trace.backend``).

    Streams are relayed in whole lines (a partial line waits for its end, which costs an
    SSE client nothing: it dispatches an event only at its blank line); every complete line
    goes out at once. With ``strip`` (the gateway asked for the usage chunk) the final usage
    chunk is removed and each terminal chunk (``finish_reason`` set) gets the backend's
    learnt fingerprint as it passes.
    """

    __slots__ = (
        "trace", "strip", "registry", "_pending", "_done", "_eat_blank", "_parts", "_last",
        "_terminal",
    )  # fmt: skip

    def __init__(
        self, trace: RequestTrace, *, strip: bool, registry: BackendRegistry | None = None
    ) -> None:
        self.trace = trace
        self.strip = strip
        self.registry = registry
        self._pending = b""
        self._done = False
        self._eat_blank = False
        self._parts: list[bytes] = []
        self._last: bytes | None = None
        self._terminal: bytes | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Take one upstream chunk; return the bytes to relay now (possibly empty: only a
        partial line, or the removed usage chunk)."""
        if not self.trace.stream:
            self._parts.append(chunk)
            return chunk
        chunk = self._whole_lines(chunk)
        if not self.strip or self._done:
            if _USAGE in chunk:
                self._last = chunk
            if _FINISH in chunk:
                self._terminal = chunk
            return chunk
        if _FINISH not in chunk and _USAGE not in chunk:
            return chunk
        return self._strip(chunk)

    def close(self) -> bytes:
        """The stream ended: return a partial last line still pending; record what was
        learnt."""
        if not self.trace.stream:
            body = b"".join(self._parts)
            self._read_json(body)
            at = body.rfind(_FINGERPRINT)
            if at >= 0:  # a string, or null: the server sends none
                self._learn(_raw_fingerprint(body[at:]) or b"")
            return b""
        rest, self._pending = self._pending, b""
        if self._last is not None:
            for line in reversed(self._last.split(b"\n")):
                usage = _final_usage(line)
                if usage is not None:
                    self._record(usage, line)
                    self._learn(_raw_fingerprint(line) or b"")  # vLLM puts it here if any
                    return rest
        if self._terminal is not None:  # no usage chunk: a fingerprint is on the terminal one
            for line in self._terminal.split(b"\n"):
                if _FINISH in line and (fingerprint := _raw_fingerprint(line)) is not None:
                    self._learn(fingerprint)
        return rest

    def _learn(self, fingerprint: bytes) -> None:
        """The answering backend's fingerprint as a server writes it (``b""``: none)."""
        if self.trace.endpoint not in _FINGERPRINTED:
            return
        state = self.registry.states.get(self.trace.backend or "") if self.registry else None
        if state is not None:
            state.fingerprint = fingerprint

    def _strip(self, buf: bytes) -> bytes:
        lines = buf.split(b"\n")  # buf ends with "\n": the last item is b""
        state = self.registry.states.get(self.trace.backend or "") if self.registry else None
        fingerprint = (state.fingerprint or b"") if state is not None else b""  # learnt
        for i, line in enumerate(lines):
            if _FINISH in line and fingerprint and _FINGERPRINT not in line:
                lines[i] = _stamp(line, fingerprint)
        at = next((i for i, ln in enumerate(lines) if _final_usage(ln) is not None), None)
        if at is None:
            return buf if not fingerprint else b"\n".join(lines)
        usage_line = lines[at]
        self._record(_parse_line(usage_line) or {}, usage_line)
        self._learn(_raw_fingerprint(usage_line) or b"")
        drop = 1
        if at + 1 < len(lines) - 1 and lines[at + 1] in (b"", b"\r"):
            drop = 2  # the blank line ending the usage event
        elif at + 1 == len(lines) - 1:
            self._eat_blank = True  # it is in the next chunk
        del lines[at : at + drop]
        self._done = True
        return b"\n".join(lines)

    def _whole_lines(self, chunk: bytes) -> bytes:
        """``chunk`` after the partial line held from the previous one, cut after its last
        newline (the rest is held for the next), without the blank line of an event this tap
        dropped (a stream is edited line by line, never a line in two pieces)."""
        if self._pending:
            chunk, self._pending = self._pending + chunk, b""
        if not chunk.endswith(b"\n"):
            end = chunk.rfind(b"\n") + 1
            chunk, self._pending = chunk[:end], chunk[end:]
        if self._eat_blank and chunk:
            self._eat_blank = False
            chunk = chunk.removeprefix(b"\r\n" if chunk.startswith(b"\r\n") else b"\n")
        return chunk

    def _read_json(self, body: bytes) -> None:
        """Usage and metrics from the tail of a JSON answer (parsed from ``"usage"`` on)."""
        at = body.rfind(_USAGE)
        if at < 0:
            return
        text = body[at:].decode("utf-8", "replace")
        decoder = json.JSONDecoder()
        try:
            usage, end = decoder.raw_decode(text, len('"usage":'))
            found = text.find('"metrics":', end)
            metrics = {}
            if found > 0:
                start = found + len('"metrics":')
                while text[start : start + 1].isspace():
                    start += 1
                metrics = decoder.raw_decode(text, start)[0]
        except ValueError:
            logger.debug("unreadable usage in a JSON answer")
            return
        self._record({"usage": usage, "metrics": metrics}, None)

    def _record(self, data: Mapping[str, Any], line: bytes | None) -> None:
        if line is not None:
            self.trace.usage_bytes = line
        metrics = data.get("metrics")
        spec = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
        self.trace.spec_decoding = spec if isinstance(spec, dict) else None


def _raw_fingerprint(line: bytes) -> bytes | None:
    """The fingerprint's JSON string exactly as the server wrote it, or None."""
    at = line.find(_FINGERPRINT)
    if at < 0:
        return None
    start = at + len(_FINGERPRINT)
    text = line[start:].decode("utf-8", "replace")
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    return text[:end].encode() if isinstance(value, str) else None


def _stamp(line: bytes, fingerprint: bytes) -> bytes:
    """``line`` (``data: {...}``) with ``"system_fingerprint"`` as its last field."""
    body = line.rstrip(b"\r")
    cr = line[len(body) :]
    close = body.rfind(b"}")
    return body[:close] + b',"system_fingerprint":' + fingerprint + body[close:] + cr
