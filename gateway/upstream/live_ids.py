"""Token ids of a live answer, for live scoring (:mod:`gateway.upstream.live_scoring`): which
requests qualify, asking vLLM for the ids, and taking them out of the client's answer.

vLLM's ``return_token_ids`` (a vLLM extension of ``/v1/completions`` and
``/v1/chat/completions``, ``vllm/entrypoints/openai/*/protocol.py``) adds the sampled ids as
``choices[i].token_ids`` and the prompt's as ``prompt_token_ids`` (per choice on completions,
top-level on chat). A non-streamed answer is ``JSONResponse(content=response.model_dump())``:
without the flag both fields are there as ``null``, so :func:`strip_token_ids` writes
``null`` back and the client gets the bytes it would have had. A stream's chunks are
``model_dump_json(exclude_unset=True)`` of choices built with ``token_ids=None`` (and, on the
first chunk, ``prompt_token_ids=None``) without the flag, so there too ``null`` is what the
client would have had; but vLLM's chat stream also sends, with the flag, chunks it would
otherwise skip (an empty ``delta`` whose text the detokenizer holds back,
``chat_completion/serving.py``): :class:`IdsTap` drops those (:func:`skipped_unasked`).

Only plain temperature sampling qualifies (:func:`qualifies`), optionally truncated by
``top_k``/``top_p``/``min_p``: the distribution canary's null bound holds for it (a kept
tail token means every dropped token was below the floor too, so truncation raises the tail
rate by at most ``1 / (1 - V e^f)``, about 1 + 1e-5), and it fails for penalties, logit
biases, structured outputs or anything else that reshapes the distribution, which would be
false alarms. Any field outside a list of known harmless ones disqualifies a request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from gateway.trace import RequestTrace
from gateway.upstream.feedback import ResponseTap

#: Fields that do not change what is sampled (checked values aside: see :func:`qualifies`).
HARMLESS = frozenset(
    {
        "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
        "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "stream", "n", "best_of",
        "user", "logprobs", "top_logprobs", "return_token_ids", "skip_special_tokens",
        "spaces_between_special_tokens", "include_stop_str_in_output", "ignore_eos",
        "add_special_tokens", "add_generation_prompt", "continue_final_message",
        "chat_template", "chat_template_kwargs", "tools", "tool_choice", "parallel_tool_calls",
        "metadata", "request_id", "priority", "cache_salt", "echo", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "min_tokens", "response_format",
        "prompt_logprobs", "return_tokens_as_token_ids", "store", "service_tier",
        "reasoning_effort", "include_reasoning", "stream_options",
    }
)  # fmt: skip
#: Fields whose value must be one of these (absent and null always do).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
    "min_tokens": (0,),
    "response_format": ({"type": "text"},),
    "tool_choice": ("auto", "none"),
    "return_token_ids": (True,),
}
_FLAG = b'"return_token_ids":true,'
#: ``"token_ids":[...]`` or ``"prompt_token_ids":[...]`` as a JSON key (a quote inside a
#: string value is escaped, so ``"token_ids":`` never matches inside generated text).
_IDS = re.compile(rb'"(prompt_token_ids|token_ids)":(\[[0-9,\s]*\])')


def qualifies(body: Mapping[str, Any]) -> bool:
    """Whether a ``/v1/completions`` or ``/v1/chat/completions`` body asks for
    one sequence of plain temperature sampling (module docstring) on a text prompt: only
    :data:`HARMLESS` fields, :data:`NEUTRAL` ones at their neutral value, a prompt that is a
    string or one list of token ids, chat messages of text only."""
    for name, value in body.items():
        if name not in HARMLESS:
            return False
        if value is not None and name in NEUTRAL and value not in NEUTRAL[name]:
            return False
    prompt = body.get("prompt")
    if "prompt" in body and not (
        isinstance(prompt, str)
        or (isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt))
    ):
        return False
    messages = body.get("messages")
    if "messages" in body and not (
        isinstance(messages, list) and all(_text_only(m) for m in messages)
    ):
        return False
    return ("prompt" in body) != ("messages" in body)


def _text_only(message: Any) -> bool:
    if not isinstance(message, Mapping):
        return False
    content = message.get("content")
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" for p in content
    )


def with_token_ids(raw: bytes) -> bytes | None:
    """``raw`` (a JSON object without ``return_token_ids``) with ``"return_token_ids":
    true`` spliced in after its opening brace, the rest of the client's bytes untouched;
    None when the body is not UTF-8 JSON (left as the client sent it)."""
    if json.detect_encoding(raw) != "utf-8":
        return None
    at = raw.find(b"{") + 1
    return raw[:at] + _FLAG + raw[at:] if at else None


def strip_token_ids(body: bytes, *, keep: bool) -> tuple[bytes, list[int] | None, list[int] | None]:
    """``(body for the client, prompt ids, sampled ids)`` of a non-streamed answer with one
    choice: the ids read from ``prompt_token_ids`` and ``token_ids`` (None when absent or
    not exactly one of each), and, unless ``keep`` (the client asked for them), both fields
    written back as ``null``, as vLLM sends them without the flag."""
    found: dict[bytes, list[bytes]] = {b"prompt_token_ids": [], b"token_ids": []}

    def cut(match: re.Match[bytes]) -> bytes:
        found[match[1]].append(match[2])
        return match[0] if keep else b'"' + match[1] + b'":null'

    out = _IDS.sub(cut, body)
    prompt, sampled = found[b"prompt_token_ids"], found[b"token_ids"]
    if len(prompt) != 1 or len(sampled) != 1:
        return out, None, None
    return out, json.loads(prompt[0]), json.loads(sampled[0])


Sink = Callable[[RequestTrace, list[int], list[int]], None]


def skipped_unasked(line: bytes) -> bool:
    """Whether an SSE ``data:`` line (ids already stripped) is a chat chunk vLLM sends only
    because token ids were asked for: one choice with an empty ``delta``, no
    ``finish_reason`` and no ``logprobs`` (``chat_completion/serving.py``: a step whose text
    the detokenizer or a parser holds back is skipped unless ``return_token_ids``)."""
    try:
        data = json.loads(line.removeprefix(b"data:").strip())
        (choice,) = data["choices"]
        return bool(
            choice["delta"] == {}
            and choice.get("finish_reason") is None
            and choice.get("logprobs") is None
        )
    except (ValueError, KeyError, TypeError):
        return False


class IdsTap(ResponseTap):
    """The tap of an answer whose token ids were asked for: a
    :class:`~gateway.upstream.feedback.ResponseTap` to the forwarder, so it takes it as is,
    that does no feedback of its own. It reads the sampled and prompt ids, and unless
    ``keep`` (the client asked for them) writes them back as ``null``, then passes the
    client's bytes through ``inner`` (the feedback tap, or None); at the end it hands the
    ids to ``sink`` with the trace (whose ``backend`` is the one that answered).

    A JSON answer is held and stripped at its end (:func:`strip_token_ids`): it is read
    whole before it is sent anyway (:func:`gateway.api.relay.send_answer`), so that costs
    the client nothing. A stream is stripped line by line as it passes (a partial line
    waits for its end, as in the feedback tap), and a chat chunk that vLLM sends only
    because ids were asked for (:func:`skipped_unasked`) is dropped with its blank line."""

    __slots__ = ("inner", "keep", "sink", "_held", "_prompt", "_ids")

    def __init__(
        self, trace: RequestTrace, inner: ResponseTap | None, *, keep: bool, sink: Sink
    ) -> None:
        super().__init__(trace, strip=False)
        self.inner, self.keep, self.sink = inner, keep, sink
        self._held: list[bytes] = []
        self._prompt: list[bytes] = []
        self._ids: list[bytes] = []

    def feed(self, chunk: bytes) -> bytes:
        """Take one upstream chunk; return the bytes to relay now (a JSON answer: none
        before its end)."""
        if not self.trace.stream:
            self._held.append(chunk)
            return b""
        chunk = self._whole_lines(chunk)
        if b'token_ids":[' in chunk:
            chunk = self._lines(chunk)
        return chunk if self.inner is None else self.inner.feed(chunk)

    def _lines(self, buf: bytes) -> bytes:
        """Complete lines with their ids read (and stripped, chunks only sent for the ids
        dropped, unless kept)."""
        lines, out, blank = buf.split(b"\n"), list[bytes](), False
        for line in lines[:-1]:
            if blank:
                blank = False
                if line in (b"", b"\r"):
                    continue
            if b'token_ids":[' in line:
                line = _IDS.sub(self._cut, line)
                if not self.keep and b'"delta":{}' in line and skipped_unasked(line):
                    blank = True
                    continue
            out.append(line)
        self._eat_blank = blank  # the dropped event's blank line is in the next chunk
        out.append(lines[-1])
        return b"\n".join(out)

    def _cut(self, match: re.Match[bytes]) -> bytes:
        (self._prompt if match[1] == b"prompt_token_ids" else self._ids).append(match[2])
        return match[0] if self.keep else b'"' + match[1] + b'":null'

    def close(self) -> bytes:
        """The answer ended: the client's last bytes (ids stripped unless kept), after the
        inner tap read them; the ids go to the sink."""
        if not self.trace.stream:
            body, prompt_ids, ids = strip_token_ids(b"".join(self._held), keep=self.keep)
            self._held = []
        else:
            body, self._pending = self._pending, b""
            if b'token_ids":[' in body:
                body = self._lines(body + b"\n")[:-1]
            prompt_ids, ids = self._stream_ids()
        if prompt_ids is not None and ids is not None:
            self.sink(self.trace, prompt_ids, ids)
        if self.inner is None:
            return body
        return self.inner.feed(body) + self.inner.close()

    def _stream_ids(self) -> tuple[list[int] | None, list[int] | None]:
        """The prompt ids (one list) and the sampled ids (every chunk's, in order) of a
        stream, or None when it had not exactly one prompt list."""
        if len(self._prompt) != 1 or not self._ids:
            return None, None
        ids = [t for part in self._ids for t in json.loads(part)]
        return json.loads(self._prompt[0]), ids
