"""The differential conformance suite's corpus and comparison (used by test_conformance.py).

Each :class:`Case` is sent to a real vLLM backend directly and through specgate; the two
answers are compared on status, the ``Content-Type`` clients read, the body's shape and
values (greedy, fp32: text, usage and token ids match), and for streams the sequence of SSE
events (consecutive events of the same shape merged: a speculative backend puts several
tokens in one chunk) and the text they carry. :data:`ON_PURPOSE` lists what differs by design.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource

MODEL = "smollm2-135m-instruct"

#: Differences on purpose, with the reason (shown under the table).
ON_PURPOSE = {
    "ids": "id, created, created_at differ per request (ids and clocks of two servers)",
    "metrics": "`metrics` carries vLLM's per-request speculation metrics when a speculative "
    "backend answered (routing), null from the plain one",
    "fingerprint": "system_fingerprint hashes the serving backend's config: it names the "
    "backend the request was routed to",
    "headers": "the gateway adds x-specgate-backend/-rule/-task and x-request-id; drops "
    "date/server/vary of the backend (hop-by-hop and server's own)",
    "chunks": "a speculative backend sends several tokens per SSE event: events of the same "
    "shape are compared merged, their text joined",
    "errors": "errors the gateway answers itself (unknown model, body not a JSON object) keep "
    "the status but use OpenAI's wording and codes",
    "operator": "operator endpoints (scaling, load, KV event sources) answer 404 to API "
    "clients: admin only, at /routes/backends/{backend}{path}",
    "own": "/health and /metrics are the gateway's own",
}
_VOLATILE = frozenset(
    {"id", "created", "created_at", "metrics", "item_id", "response_id", "system_fingerprint"}
)


@dataclass(frozen=True)
class Case:
    """One request of the corpus; ``expect`` says which on-purpose difference applies
    (None: everything must match)."""

    name: str
    method: str
    path: str
    body: Any = None
    raw: bytes | None = None
    expect: str | None = None


@dataclass
class Answer:
    status: int
    content_type: str
    body: Any = None
    events: list[tuple[str, Any]] = field(default_factory=list)
    text: str = ""


def corpus(openapi_paths: dict[str, list[str]]) -> list[Case]:
    """The requests: the issue's examples, the vLLM extras, streams, errors, then every
    other path of the backend's OpenAPI (a minimal request each)."""
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    code = "def fibonacci(n):"
    cases = [
        Case(
            "completions greedy",
            "POST",
            "/v1/completions",
            {"model": MODEL, "prompt": code, "max_tokens": 16, "temperature": 0},
        ),
        Case(
            "completions stream",
            "POST",
            "/v1/completions",
            {"model": MODEL, "prompt": code, "max_tokens": 16, "temperature": 0, "stream": True},
        ),
        Case(
            "completions logit_bias (issue ex. 1)",
            "POST",
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": code,
                "max_tokens": 8,
                "temperature": 0,
                "logit_bias": {"13": -100},
            },
        ),
        Case(
            "completions logit_bias stream",
            "POST",
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": code,
                "max_tokens": 8,
                "temperature": 0,
                "logit_bias": {"13": -100},
                "stream": True,
            },
        ),
        Case(
            "completions vLLM extras",
            "POST",
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": code,
                "max_tokens": 8,
                "temperature": 0,
                "top_k": 1,
                "return_token_ids": True,
                "logprobs": 2,
            },
        ),
        Case(
            "chat greedy",
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": chat, "max_tokens": 16, "temperature": 0},
        ),
        Case(
            "chat stream + usage",
            "POST",
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": chat,
                "max_tokens": 16,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
        Case(
            "chat min_p 0.3 (issue ex. 1)",
            "POST",
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Complete: {code}"}],
                "max_tokens": 8,
                "temperature": 0.3,
                "min_p": 0.05,
                "seed": 1,
            },
        ),
        Case(
            "chat min_p stream",
            "POST",
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": chat,
                "max_tokens": 8,
                "temperature": 0,
                "min_p": 0.05,
                "stream": True,
            },
        ),
        Case(
            'chat temperature "0.2" (issue ex. 3)',
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": chat, "max_tokens": 8, "temperature": "0.2", "seed": 7},
        ),
        Case(
            'chat temperature "hot"',
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": chat, "max_tokens": 8, "temperature": "hot"},
        ),
        Case(
            "chat no model",
            "POST",
            "/v1/chat/completions",
            {"messages": chat, "max_tokens": 4, "temperature": 0},
        ),
        Case(
            "chat model 7",
            "POST",
            "/v1/chat/completions",
            {"model": 7, "messages": chat, "max_tokens": 4},
        ),
        Case("chat messages missing", "POST", "/v1/chat/completions", {"model": MODEL}),
        Case(
            "chat unknown model",
            "POST",
            "/v1/chat/completions",
            {"model": "nope", "messages": chat},
            expect="errors",
        ),
        Case(
            "chat invalid JSON", "POST", "/v1/chat/completions", raw=b"{not json", expect="errors"
        ),
        Case(
            "chat max_tokens -1",
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": chat, "max_tokens": -1},
        ),
        Case(
            "responses (issue ex. 2)",
            "POST",
            "/v1/responses",
            {"model": MODEL, "input": "Say hi", "max_output_tokens": 8, "temperature": 0},
        ),
        Case(
            "responses stream",
            "POST",
            "/v1/responses",
            {
                "model": MODEL,
                "input": "Say hi",
                "max_output_tokens": 8,
                "temperature": 0,
                "stream": True,
            },
        ),
        Case(
            "responses items + instructions",
            "POST",
            "/v1/responses",
            {
                "model": MODEL,
                "instructions": "Answer in one word.",
                "temperature": 0,
                "max_output_tokens": 8,
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi?"}]}],
            },
        ),
        Case("responses retrieve unknown", "GET", "/v1/responses/resp_unknown"),
        Case("responses cancel unknown", "POST", "/v1/responses/resp_unknown/cancel"),
        Case(
            "messages (issue ex. 2)",
            "POST",
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 8,
                "temperature": 0,
                "system": "Be brief.",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
            },
        ),
        Case(
            "messages stream",
            "POST",
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 8,
                "temperature": 0,
                "stream": True,
                "messages": [{"role": "user", "content": "Say hi"}],
            },
        ),
        Case(
            "messages count_tokens",
            "POST",
            "/v1/messages/count_tokens",
            {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}]},
        ),
        Case("tokenize", "POST", "/tokenize", {"model": MODEL, "prompt": "hello world"}),
        Case("detokenize", "POST", "/detokenize", {"model": MODEL, "tokens": [6004, 665]}),
        Case("version", "GET", "/version"),
        Case("models (issue ex. 4)", "GET", "/v1/models"),
    ]
    covered = {(c.method, c.path) for c in cases} | {
        ("GET", "/v1/responses/{response_id}"),
        ("POST", "/v1/responses/{response_id}/cancel"),
    }
    for path, methods in sorted(openapi_paths.items()):
        for method in methods:
            if (method.upper(), path) in covered or "{" in path:
                continue
            expect = "own" if path in ("/health", "/metrics") else None
            if path in (
                "/load",
                "/kv_event_sources",
                "/scale_elastic_ep",
                "/is_scaling_elastic_ep",
            ):
                expect = "operator"
            body = {} if method == "post" else None
            cases.append(
                Case(f"openapi {method.upper()} {path}", method.upper(), path, body, expect=expect)
            )
    return cases


def send(client: httpx.Client, base: str, case: Case) -> Answer:
    """Send ``case`` to ``base``; read JSON, or SSE events with httpx-sse."""
    content = (
        case.raw
        if case.raw is not None
        else (None if case.body is None else json.dumps(case.body).encode())
    )
    headers = {"content-type": "application/json"} if content is not None else {}
    with client.stream(case.method, base + case.path, content=content, headers=headers) as resp:
        kind = resp.headers.get("content-type", "").split(";")[0]
        answer = Answer(resp.status_code, kind)
        if kind == "text/event-stream":
            for sse in EventSource(resp).iter_sse():
                data = sse.data if sse.data == "[DONE]" else json.loads(sse.data)
                answer.events.append((sse.event, data))
            answer.text = "".join(_texts([d for _, d in answer.events]))
            return answer
        resp.read()
        try:
            answer.body = resp.json()
        except ValueError:
            answer.body = resp.text
    return answer


def _texts(value: Any) -> list[str]:
    """Generated text in order: string leaves under text/content/delta keys."""
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    if isinstance(value, dict):
        out = []
        for key, inner in value.items():
            if key in ("text", "content", "delta") and isinstance(inner, str):
                out.append(inner)
            elif key != "response":  # the created/completed Response repeats the text
                out.extend(_texts(inner))
        return out
    return []


def normal(value: Any) -> Any:
    """``value`` without volatile keys (ids, timestamps, per-request metrics)."""
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [normal(v) for v in value]
    return value


def shape(value: Any) -> Any:
    """The structure of ``value``: keys and JSON types, volatile keys left out."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [shape(v) for v in value]
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def merged(events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The event sequence by shape, runs of the same shape merged."""
    out: list[tuple[str, Any]] = []
    for name, data in events:
        item = (name, shape(data))
        if not out or out[-1] != item:
            out.append(item)
    return out


def compare(direct: Answer, through: Answer, case: Case) -> list[str]:
    """What differs between the two answers (empty: they match)."""
    diffs = []
    if direct.status != through.status:
        diffs.append(f"status {direct.status} != {through.status}")
    if direct.content_type != through.content_type:
        diffs.append(f"content-type {direct.content_type} != {through.content_type}")
    if diffs or case.expect == "errors":
        return diffs
    if direct.events or through.events:
        if merged(direct.events) != merged(through.events):
            diffs.append("event sequence")
        if direct.text != through.text:
            diffs.append(f"stream text {direct.text!r} != {through.text!r}")
        return diffs
    if shape(direct.body) != shape(through.body):
        diffs.append("body shape")
    elif not same(normal(direct.body), normal(through.body)):
        diffs.append(
            "body values at " + first_difference(normal(direct.body), normal(through.body))
        )
    return diffs


#: Float tolerance of :func:`same`: vLLM on CPU computes the same token's logprob to within
#: ~1e-6 differently from run to run (batch composition, a speculative backend's verify
#: pass): -0.037904150784015656 direct, -0.03790392354130745 through the gateway in one CI run.
FLOAT_REL, FLOAT_ABS = 1e-4, 1e-6


def same(a: Any, b: Any) -> bool:
    """``a == b`` for JSON values, except that floats need only agree to within
    FLOAT_REL/FLOAT_ABS (ints, strings, tokens and structure compare exactly)."""
    if isinstance(a, float) or isinstance(b, float):
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
        return numbers and math.isclose(a, b, rel_tol=FLOAT_REL, abs_tol=FLOAT_ABS)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def first_difference(a: Any, b: Any, at: str = "") -> str:
    """Where two equal-shaped JSON values first differ, and the two values there."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            if a[key] != b.get(key):
                return first_difference(a[key], b.get(key), f"{at}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{at}[{i}]")
    return f"{at or '.'}: {json.dumps(a)[:80]} != {json.dumps(b)[:80]}"
