"""Other request shapes adapted into the chat-messages shape that routing reads.

The task classifier and the prompt statistics read an OpenAI chat body (``messages`` with
string or ``[{"type": "text", "text": ...}]`` content, ``tools``, ``tool_choice``,
``response_format``). The Responses API (``POST /v1/responses``) and Anthropic's Messages API
(``POST /v1/messages``) carry the same information in other shapes; the views here translate
them, so routing stays one code path. Views are only read by routing: the client's bytes are
what the backend receives.

Bounded work whatever the body's size: at most :data:`HEAD` + :data:`TAIL` items and
:data:`MAX_BLOCKS` content blocks per item are looked at, strings are referenced, not copied.
Never raises on any JSON value (unreadable parts are skipped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Items (messages) kept from the head and the tail of a long conversation.
HEAD, TAIL = 4, 12
#: Content blocks read per item.
MAX_BLOCKS = 16
#: Block and item types whose text the classifier reads.
_TEXT_KEYS = ("text", "output", "content", "input", "arguments")


def _items(seq: Any) -> list[Any]:
    if not isinstance(seq, list):
        return []
    if len(seq) <= HEAD + TAIL:
        return seq
    return [*seq[:HEAD], *seq[-TAIL:]]


def _text_of(value: Any, depth: int = 0) -> list[dict[str, str]]:
    """Text parts (``{"type": "text", "text": ...}``) found in a content value: a string,
    a block, or a list of blocks (tool results nest their content once more)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if isinstance(value, Mapping) and depth < 3:
        for key in _TEXT_KEYS:
            if key in value:
                inner = value[key]
                if isinstance(inner, Mapping) and key == "input":  # a tool call's arguments
                    return []
                return _text_of(inner, depth + 1)
        return []
    if isinstance(value, list) and depth < 3:
        parts: list[dict[str, str]] = []
        for block in value[:MAX_BLOCKS]:
            parts.extend(_text_of(block, depth + 1))
        return parts[:MAX_BLOCKS]
    return []


def _message(role: Any, content: Any) -> dict[str, Any]:
    role = role if isinstance(role, str) else "user"
    if role == "developer":
        role = "system"
    return {"role": role, "content": _text_of(content)}


def _tool_choice(choice: Any) -> Any:
    """Anthropic's ``{"type": "auto" | "any" | "tool" | "none"}`` as OpenAI's tool_choice."""
    if isinstance(choice, Mapping):
        kind = choice.get("type")
        if kind in ("any", "tool"):
            return "required"
        if kind in ("auto", "none"):
            return kind
        return "auto"
    return choice if isinstance(choice, str) else None


def _chat_view(body: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields every chat view carries: ``messages`` as read, the rest from ``body``."""
    return {
        "model": body.get("model"),
        "temperature": body.get("temperature"),
        "stream": body.get("stream"),
        "messages": messages,
        "tools": body.get("tools"),
        "tool_choice": _tool_choice(body.get("tool_choice")),
    }


def messages_view(body: dict[str, Any]) -> dict[str, Any]:
    """The chat view of an Anthropic Messages body: ``system`` (string or text blocks) as a
    system message, each message's content blocks (text, tool_use input, tool_result
    content) as text parts, ``tools`` and ``tool_choice`` mapped to OpenAI's meaning."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append(_message("system", system))
    for msg in _items(body.get("messages")):
        if isinstance(msg, Mapping):
            messages.append(_message(msg.get("role"), msg.get("content")))
    return _chat_view(body, messages)


def responses_view(body: dict[str, Any]) -> dict[str, Any]:
    """The chat view of a Responses body: ``instructions`` as a system message, ``input``
    (a string, or items: messages with string or ``input_text`` content, function call
    outputs) as messages, ``tools``, ``tool_choice``, and ``text.format`` as
    ``response_format``."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    for item in _items(given):
        if isinstance(item, str):
            messages.append({"role": "user", "content": item})
        elif isinstance(item, Mapping):
            kind = item.get("type")
            role = item.get("role") if kind in (None, "message") else "tool"
            messages.append(_message(role, item))
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    return {**_chat_view(body, messages), "response_format": fmt}
