"""``python -m bench.live_overhead``: what live scoring adds to the request path, in CPU time
per call, against a reference measured in the same run (``json.loads`` of the request's 2 KB
body, which the gateway does for every request anyway).

Measured: :meth:`gateway.upstream.live_scoring.LiveScorer.attach` for a sampled request to plain
(not taken), a greedy one to a speculative backend (not taken) and a sampled one to a
speculative backend (taken: the flag spliced in, the tap built); and, per chunk of a taken
stream, :class:`~gateway.upstream.live_ids.IdsTap` against the feedback tap alone. Run it
under ``flock /tmp/specgate-bench.lock`` on a shared machine; nothing is asserted.
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable
from pathlib import Path

import httpx

from contracts.config import load_config
from gateway.trace import RequestTrace
from gateway.upstream.feedback import ResponseTap
from gateway.upstream.live_ids import IdsTap
from gateway.upstream.live_scoring import LiveScorer, LiveScoringBudget
from gateway.upstream.sample_canary import SampleCanary, SampleCanaryBudget
from gateway.upstream.state import BackendRegistry, Backends

ROOT = Path(__file__).resolve().parents[1]


CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"hello"},"logprobs":null,'
    b'"finish_reason":null,"token_ids":[1234]}]}\n\n'
)


def per_call(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of ``fn``."""
    return timeit.timeit(fn, number=number) / number


def main() -> None:
    """Print the figures (microseconds per call and ratios)."""
    config = load_config(ROOT / "config" / "local.yaml")
    canary = SampleCanary(
        # the client is unused: no round runs
        Backends(httpx.AsyncClient(), lambda: config, BackendRegistry(config.backends)),
        SampleCanaryBudget(),
        timeout_s=5,
    )
    scorer = LiveScorer(canary, LiveScoringBudget(tokens_per_minute=1e12))
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}],
            "temperature": 0.5, "max_tokens": 128}  # fmt: skip
    raw, greedy = json.dumps(body).encode(), body | {"temperature": 0}
    trace = RequestTrace("r", "/v1/chat/completions", True)
    path, n = "/v1/chat/completions", 20_000
    ref = per_call(lambda: json.loads(raw), n)
    rows = {
        "sampled to plain": (body, "plain"),
        "greedy to a speculative backend": (greedy, "ngram"),
        "sampled to a speculative backend, taken": (body, "ngram"),
    }
    print(f"reference, json.loads of the 2 KB body: {ref * 1e6:.2f} us")
    for name, (b, first) in rows.items():
        t = per_call(lambda b=b, f=first: scorer.attach(path, b, raw, f, trace), n)
        print(f"LiveScorer.attach, {name}: {t * 1e6:.2f} us ({t / ref:.2f}x the reference)")

    def stream(tap: ResponseTap, chunk: bytes) -> None:
        for _ in range(100):
            tap.feed(chunk)

    unasked = CHUNK.replace(b"[1234]", b"null")
    ids = per_call(
        lambda: stream(IdsTap(trace, None, keep=False, sink=lambda *_: None), CHUNK), 2000
    )
    alone = per_call(lambda: stream(ResponseTap(trace, strip=False), unasked), 2000)
    print(
        f"a taken stream, per chunk: IdsTap {ids * 1e4:.2f} us, the feedback tap alone "
        f"{alone * 1e4:.2f} us ({ids / alone:.2f}x)"
    )


if __name__ == "__main__":
    main()
