"""Read a vLLM server's error bodies and error events (the wire format both the routing
knowledge and the upstream layer read)."""

from __future__ import annotations

import json
from typing import Any


def error_object(payload: str | bytes) -> dict[str, Any] | None:
    """The error object of a backend's error body or SSE event data: ``error`` of
    ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's and vLLM's envelope;
    Anthropic's adds ``"type": "error"`` beside it), or the whole of vLLM's older
    ``{"object": "error", "message", "type", "code"}``. None for anything else: not JSON,
    not an object, an ordinary answer or chunk."""
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict):
        return error
    return data if data.get("object") == "error" else None
