"""One access-log line per finished request, on the ``specgate.access`` logger.

Fields: request id, endpoint, stream, task, rule, backend, attempts, status, error, time to
first token and duration (milliseconds), completion tokens. Never the prompt, the output or
any header but the request id (which the client may choose: it is escaped and cut to 128
characters). ``text`` gives ``key=value`` pairs, ``json`` one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Literal

from gateway.trace import RequestTrace

LogFormat = Literal["text", "json"]
_PLAIN = re.compile(r"[A-Za-z0-9_.:/@+-]+")


def access_fields(trace: RequestTrace) -> dict[str, Any]:
    """The logged fields of a finished trace (times in ms, rounded to 0.1 ms)."""

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 1)

    return {
        "request_id": trace.request_id[:128],
        "endpoint": trace.endpoint,
        "stream": trace.stream,
        "task": trace.task,
        "rule": trace.rule,
        "backend": trace.backend,
        "attempts": trace.attempts,
        "status": trace.status,
        "error": trace.error,
        "ttft_ms": ms(trace.ttft_s),
        "duration_ms": ms(trace.duration_s),
        "completion_tokens": trace.completion_tokens(),
    }


def _text_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    return text if _PLAIN.fullmatch(text) else json.dumps(text)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else str(round(seconds * 1000, 1))


def text_line(trace: RequestTrace) -> str:
    """:func:`access_fields` as ``key=value`` pairs, formatted directly (the hot path: one
    line per request); the same text as formatting the fields one by one."""
    request_id = trace.request_id[:128]
    tokens = trace.completion_tokens()
    return (
        f"request_id={request_id if _PLAIN.fullmatch(request_id) else _text_value(request_id)}"
        f" endpoint={_text_value(trace.endpoint)}"
        f" stream={'true' if trace.stream else 'false'}"
        f" task={trace.task or '-'} rule={_text_value(trace.rule)}"
        f" backend={_text_value(trace.backend)} attempts={trace.attempts}"
        f" status={_text_value(trace.status)} error={_text_value(trace.error)}"
        f" ttft_ms={_ms(trace.ttft_s)} duration_ms={_ms(trace.duration_s)}"
        f" completion_tokens={'-' if tokens is None else tokens}"
    )


class AccessLog:
    """Request-trace observer writing one INFO line per request to ``specgate.access``."""

    def __init__(self, fmt: LogFormat = "text", logger: logging.Logger | None = None) -> None:
        self.fmt = fmt
        self.logger = logger or logging.getLogger("specgate.access")

    def observe(self, trace: RequestTrace) -> None:
        """Log ``trace`` (a finished request)."""
        if not self.logger.isEnabledFor(logging.INFO):
            return
        if self.fmt == "json":
            line = json.dumps(access_fields(trace), separators=(",", ":"))
        else:
            line = text_line(trace)
        self.logger.info("%s", line)
