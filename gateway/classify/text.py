"""Bounded text extraction from OpenAI request bodies.

The classifier must never read a whole 1 MB prompt or walk 10,000 messages on the event loop,
so everything here works on head and tail slices: a fixed number of messages, a fixed number of
content parts per message, and a fixed number of characters per slice. Only ``len()`` of the
untouched strings is taken, which is O(1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gateway.classify.lexicon import DOC_TAGS, TEMPLATE_MARKUP

# Messages looked at: the first few (system prompts) and the last few (the live exchange).
HEAD_MESSAGES = 2
TAIL_MESSAGES = 8
MAX_PARTS = 8  # content parts read per message
# Characters kept from the final user message (head, tail) and from every other message.
LAST_SLICE = (1000, 400)
OTHER_SLICE = (600, 200)
OTHER_BUDGET = 2400  # total characters kept from non-final messages
# The "instruction window": where requests such as "write a poem" are phrased.
INSTR_SLICE = (400, 300)
INSTR_OTHER = 400  # head characters of the system prompt and earlier user turns
EDGE = 300  # characters of the final user message's own head and tail

_CONTEXT_ROLES = frozenset({"system", "developer"})
# Results of tool calls: supplied material (search hits, records), read apart from the text so
# that a weather JSON or a search-result list never reads as source code.
_TOOL_ROLES = frozenset({"tool", "function", "ipython"})


class RequestText(NamedTuple):
    """Bounded views of a request's text (a NamedTuple: immutable, and cheaper to build on
    the hot path than a frozen dataclass).

    ``text``: slices of the examined messages in their order, final user message last, original
    case, at most about 3,800 characters; ``text[:split]`` comes from the other messages.
    ``instr``: the lower-cased instruction window (head and tail of the final user message,
    heads of the system prompt and of recent earlier user turns). ``head``/``tail``: up to
    300 lower-cased characters from each end of the final user message. ``last_chars``: true
    length in characters of the final user message; ``context_chars``: of the other examined
    messages except assistant turns (system prompts, earlier user turns, tool results).
    ``tool_text``: slices of the tool results (lower case, at most 600 characters),
    ``tool_chars`` their true length (also counted in ``context_chars``). ``doc_tags``: markup
    tags around supplied material (``<document>``, ``<source>``, ...) that were removed from
    ``text`` and ``instr``. ``n_messages``: the messages of the request (1 for a prompt).
    """

    text: str
    instr: str
    head: str
    tail: str
    last_chars: int
    context_chars: int
    n_messages: int
    split: int
    tool_text: str = ""
    tool_chars: int = 0
    doc_tags: int = 0


def clip(s: str, head: int, tail: int) -> str:
    """Return ``s`` if it has at most ``head + tail`` characters, else its head and tail."""
    if len(s) <= head + tail:
        return s
    return s[:head] + "\n" + s[len(s) - tail :] if tail else s[:head]


def _content(content: Any, head: int, tail: int) -> tuple[str, int]:
    """Clipped text of a message ``content`` (string or list of parts) and its true length."""
    if isinstance(content, str):
        return clip(content, head, tail), len(content)
    if not isinstance(content, Sequence) or isinstance(content, bytes | bytearray):
        return "", 0
    pieces: list[str] = []
    total = 0
    for part in content[:MAX_PARTS]:
        text = part.get("text") if isinstance(part, Mapping) else part
        if isinstance(text, str):
            pieces.append(clip(text, head, tail))
            total += len(text)
    return clip("\n".join(pieces), head, tail), total


def _from_prompt(prompt: Any) -> tuple[str, int] | None:
    """Text of a ``/v1/completions`` prompt, without chat-template markup (roles, special
    tokens: see ``lexicon.TEMPLATE_MARKUP``); None for token ids or anything unreadable."""
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]  # a batch: the first prompt stands for the rest
    if isinstance(prompt, str):
        text = clip(prompt, *LAST_SLICE)  # chat-template markup dropped from the slice only
        return TEMPLATE_MARKUP.sub(" ", text).strip(), len(prompt)
    return None


def _pick_messages(messages: Sequence[Any]) -> list[Mapping[str, Any]]:
    """The first HEAD_MESSAGES and last TAIL_MESSAGES well-formed messages, in order."""
    n = len(messages)
    if n > HEAD_MESSAGES + TAIL_MESSAGES:
        picked = [*messages[:HEAD_MESSAGES], *messages[n - TAIL_MESSAGES :]]
    else:
        picked = list(messages)
    return [m for m in picked if isinstance(m, Mapping)]


def _role(msg: Mapping[str, Any]) -> str:
    role = msg.get("role")
    return role if isinstance(role, str) else ""


def _last_user_index(messages: list[Mapping[str, Any]]) -> int:
    """Index of the final user message, or of the final message if no user spoke."""
    for i in range(len(messages) - 1, -1, -1):
        if _role(messages[i]) == "user":
            return i
    return len(messages) - 1


class _Messages(NamedTuple):
    text: str
    heads: list[str]
    last: str
    last_chars: int
    context_chars: int
    n_messages: int
    tool_text: str
    tool_chars: int


def _from_messages(messages: Sequence[Any]) -> _Messages | None:
    """The bounded views of a chat request, or None.

    The character budget goes to system prompts first, then to the most recent turns.
    ``context_chars`` counts supplied material only: assistant turns are the model's own output.
    Tool results are kept apart (``tool_text``): material, not the conversation's text.
    """
    picked = _pick_messages(messages)
    if not picked:
        return None
    last_i = _last_user_index(picked)
    last, last_chars = _content(picked[last_i].get("content"), *LAST_SLICE)
    others = [i for i in range(len(picked)) if i != last_i]
    others.sort(key=lambda i: (_role(picked[i]) not in _CONTEXT_ROLES, -i))
    kept: dict[int, str] = {}
    heads: dict[int, str] = {}
    tools: list[str] = []
    context_chars = budget = tool_chars = 0
    for i in others:
        role = _role(picked[i])
        piece, n = _content(picked[i].get("content"), *OTHER_SLICE)
        if role != "assistant":
            context_chars += n
        if role in _TOOL_ROLES:
            tool_chars += n
            tools.append(piece[:INSTR_OTHER])
            continue
        if budget < OTHER_BUDGET and piece:
            kept[i] = piece[: OTHER_BUDGET - budget]
            budget += len(kept[i])
        if role in _CONTEXT_ROLES or (role == "user" and i > last_i - 4):
            heads[i] = piece[:INSTR_OTHER].lower()
    text = "\n".join([*(kept[i] for i in sorted(kept)), last])  # last starts at len - len(last)
    return _Messages(
        text,
        [heads[i] for i in sorted(heads)],
        last,
        last_chars,
        context_chars,
        len(messages),
        "\n".join(tools)[:600].lower(),
        tool_chars,
    )


def read_request(body: Mapping[str, Any]) -> RequestText | None:
    """Extract bounded text from a chat or completions request body.

    Returns None when there is no readable text (token-id prompts, missing or malformed
    ``messages``/``prompt``). Never raises on malformed input of the usual JSON types.
    """
    if not isinstance(body, Mapping):
        return None
    messages = body.get("messages")
    tool_text, tool_chars = "", 0
    if isinstance(messages, Sequence) and not isinstance(messages, str | bytes | bytearray):
        got = _from_messages(messages)
        if got is None:
            return None
        text, heads, last, last_chars, context_chars, n, tool_text, tool_chars = got
    else:
        prompt = _from_prompt(body.get("prompt"))
        if prompt is None:
            return None
        text, last_chars = prompt
        heads, last, context_chars, n = [], text, 0, 1
    if not text.strip() and not tool_text.strip():
        return None
    tags = 0
    if "<" in text:  # markup around documents: counted, then dropped (it is not code)
        before, last = text[: len(text) - len(last)], last
        before, n_before = DOC_TAGS.subn(" ", before)
        last, n_last = DOC_TAGS.subn(" ", last)
        tags = n_before + n_last
        text = before + last
        heads = [DOC_TAGS.sub(" ", h) for h in heads]
    window = clip(last, *INSTR_SLICE).lower()
    return RequestText(
        text=text,
        instr="\n".join([*heads, window]),
        head=window[:EDGE],
        tail=window[-EDGE:],
        last_chars=last_chars,
        context_chars=context_chars,
        n_messages=n,
        split=len(text) - len(last),
        tool_text=tool_text,
        tool_chars=tool_chars,
        doc_tags=tags,
    )
