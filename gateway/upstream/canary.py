"""Correctness canary: greedy outputs of each speculative backend against its plain twin.

Speculation must be lossless; a misconfigured draft (wrong tokenizer or revision) or an engine
bug breaks that silently. Every ``interval_s`` seconds, off the request path, the
:class:`Canary` sends :data:`CANARY_PROMPTS` (``temperature: 0``, top-2 ``logprobs``,
``return_token_ids``) to every speculative backend and to its plain twin (the first healthy
non-speculative backend serving the same model) and compares the token ids.

Where they diverge, the plain run's top-2 logprobs at the first differing position decide
(:func:`compare`): a top-1/top-2 margin under ``near_tie_margin`` nats, with the speculative
token among the plain top-2, is a near-tie that numerics explain (bf16 on CPU diverges so on
2-3 of 5 prompts; float32 on CPU and bf16 on a GPU matched); a larger margin is a fault, and
marks the backend ``suspect`` (the routing policy then skips it). A later round where every
prompt matches or near-ties clears it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx

from contracts.config import BackendConfig, GatewayConfig
from gateway.upstream.state import BackendRegistry, Backends, BackendState

logger = logging.getLogger(__name__)

#: Short greedy prompts of different kinds: code, prose, list, math, chat-ish.
CANARY_PROMPTS: tuple[str, ...] = (
    'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same backwards."""\n',
    "The old lighthouse keeper climbed the stairs one last time. He",
    "Three tips for staying healthy:\n1.",
    "Question: What is 17 plus 25?\nAnswer:",
    "User: Can you recommend a good book for a long flight?\nAssistant:",
)

Kind = Literal["matched", "near_tie", "fault", "undecided"]
KINDS: tuple[Kind, ...] = ("matched", "near_tie", "fault", "undecided")


@dataclass(frozen=True, slots=True)
class Generation:
    """One greedy completion as vLLM returns it with ``logprobs`` and ``return_token_ids``.

    ``token_ids``: the generated ids; ``tokens``: their texts (``logprobs.tokens``, None when
    the answer carried no logprobs); ``top``: per position, ``{token text: logprob in nats}``
    for the chosen token plus the top-k (``logprobs.top_logprobs``; text-keyed, so two ids
    decoding to the same text share one key).
    """

    token_ids: tuple[int, ...]
    tokens: tuple[str, ...] | None = None
    top: tuple[dict[str, float] | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The comparison of one prompt: ``kind``, and for a divergence the first differing
    ``position`` (0-based generated token), both tokens' texts (None: unknown, e.g. the
    run had ended) and the plain run's top-1 minus top-2 logprob ``margin`` in nats."""

    kind: Kind
    position: int | None = None
    plain_token: str | None = None
    spec_token: str | None = None
    margin: float | None = None
    reason: str = ""


def parse_completion(body: Any) -> Generation:
    """Read ``choices[0]`` of a non-streamed ``/v1/completions`` answer; logprobs are optional.

    Raises ``ValueError`` when the answer has no ``token_ids`` (a server that ignores
    ``return_token_ids``): without ids there is nothing to compare.
    """
    try:
        choice = body["choices"][0]
        ids = tuple(int(t) for t in choice["token_ids"])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ValueError("answer without choices[0].token_ids") from None
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, Mapping):
        return Generation(ids)
    tokens, top = logprobs.get("tokens"), logprobs.get("top_logprobs")
    if not isinstance(tokens, list) or len(tokens) != len(ids):
        tokens = None
    if not isinstance(top, list) or len(top) != len(ids):
        top = None
    steps = [
        {str(k): float(v) for k, v in s.items() if isinstance(v, int | float)}
        if isinstance(s, Mapping)
        else None
        for s in top or []
    ]
    return Generation(
        ids, None if tokens is None else tuple(map(str, tokens)), tuple(steps) or None
    )


async def post_completion(
    client: httpx.AsyncClient, backend: BackendConfig, body: dict[str, Any], timeout_s: float
) -> Any:
    """POST ``body`` to ``backend``'s ``/v1/completions`` (with its API key) within
    ``timeout_s`` seconds: the decoded JSON answer, or a short reason (str) why there is
    none (a status other than 200, an httpx error's name, unreadable JSON). Shared by the
    greedy and the distribution canary, which never raise on a backend's failure."""
    headers = {"authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
    url = f"{backend.base_url}/v1/completions"
    try:
        resp = await client.post(url, json=body, headers=headers, timeout=timeout_s)
        if resp.status_code != 200:
            return f"answered {resp.status_code}"
        return resp.json()
    except httpx.HTTPError as exc:
        return type(exc).__name__
    except ValueError:
        return "unreadable answer"


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (one ending first counts), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(plain: Generation, spec: Generation, near_tie_margin: float) -> Verdict:
    """Judge a speculative run against its plain twin's (same prompt, greedy).

    At the first differing position the plain run's top-1 minus top-2 logprob is the margin.
    At or above ``near_tie_margin`` the plain model was sure of its token: a fault. Below it,
    the divergence is a near-tie when the speculative token is the plain runner-up and, if the
    speculative run has logprobs there, the two tokens are within ``near_tie_margin`` in its
    view too (a near-tie looks like one from both sides); otherwise a fault. Without the plain
    top-2 there (no logprobs, the plain run ended, two top ids sharing one text) or the
    speculative token's text, the verdict is "undecided".
    """
    pos = first_divergence(plain.token_ids, spec.token_ids)
    if pos is None:
        return Verdict("matched")
    a = plain.tokens[pos] if plain.tokens is not None and pos < len(plain.tokens) else None
    b = spec.tokens[pos] if spec.tokens is not None and pos < len(spec.tokens) else None
    step = plain.top[pos] if plain.top is not None and pos < len(plain.top) else None
    if not step or len(step) < 2:
        why = "no plain top-2 logprobs at the divergence"
        return Verdict("undecided", pos, a, b, None, why)
    (first, lp1), (second, lp2) = sorted(step.items(), key=lambda kv: kv[1], reverse=True)[:2]
    margin = lp1 - lp2
    if margin >= near_tie_margin:
        return Verdict("fault", pos, a, b, margin, "the plain model was sure of its token")
    if b is None or a is None or a == b:
        why = "speculative token unknown or sharing the plain token's text"
        return Verdict("undecided", pos, a, b, margin, why)
    if b not in (first, second):
        return Verdict("fault", pos, a, b, margin, "speculative token not in the plain top-2")
    own = spec.top[pos] if spec.top is not None and pos < len(spec.top) else None
    if own and (a not in own or b not in own or abs(own[b] - own[a]) >= near_tie_margin):
        why = "no near-tie in the speculative run's own logprobs"
        return Verdict("fault", pos, a, b, margin, why)
    return Verdict("near_tie", pos, a, b, margin, "a near-tie that numerics explain")


def suspect_reason(prompt: int, verdict: Verdict) -> str:
    """The ``BackendState.suspect`` text for a fault on prompt index ``prompt``."""
    margin = "unknown" if verdict.margin is None else f"{verdict.margin:.3f}"
    return (
        f"canary: prompt {prompt} diverged at token {verdict.position}: "
        f"plain {verdict.plain_token!r} vs {verdict.spec_token!r}, top-2 margin {margin} nats"
        f" ({verdict.reason})"
    )


def plain_twin(config: GatewayConfig, registry: BackendRegistry, model: str) -> str | None:
    """The first non-speculative backend serving ``model`` that is healthy (or not yet
    probed) and not suspect, in config order; None if there is none."""
    for name, backend in config.backends.items():
        state = registry.states.get(name)
        if not backend.spec.speculative and backend.served_model == model and state:
            if state.available and state.suspect is None:
                return name
    return None


@dataclass(slots=True)
class CanaryResult:
    """What the canary saw for one speculative backend: its twin, the last round's and all
    rounds' verdict counts, the last divergence (the first fault of its round, else its first
    near-tie: prompt index, verdict, unix time) and why the last round was skipped or left a
    prompt undecided."""

    twin: str | None = None
    counts: Counter[str] = field(default_factory=Counter)
    totals: Counter[str] = field(default_factory=Counter)
    last_divergence: dict[str, Any] | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict for ``/routes``."""
        return {
            "twin": self.twin,
            "last_round": {k: self.counts[k] for k in KINDS},
            "totals": {k: self.totals[k] for k in KINDS},
            "last_divergence": self.last_divergence,
            "note": self.note,
        }


class Canary:
    """Runs canary rounds with the shared ``client`` every ``interval_s`` seconds.

    Requests (``max_tokens`` greedy tokens, at most ``timeout_s`` seconds each) go one at a
    time: a light, steady load, and batch-size effects stay out of the comparison. A twin
    answers each prompt once per round. ``backends``: :class:`~gateway.upstream.state.Backends`.
    """

    def __init__(
        self,
        backends: Backends,
        *,
        interval_s: float,
        near_tie_margin: float,
        max_tokens: int,
        timeout_s: float,
    ) -> None:
        self.client, self.config = backends.client, backends.config
        self.registry = backends.registry
        self.interval_s, self.near_tie_margin = interval_s, near_tie_margin
        self.max_tokens, self.timeout_s = max_tokens, timeout_s
        self.results: dict[str, CanaryResult] = {}
        self.rounds = 0
        self.last_round: float | None = None

    async def run_round(self) -> None:
        """Check every speculative backend once against its plain twin."""
        config = self.config()
        plain: dict[tuple[str, int], Generation | str] = {}  # (twin, prompt) -> answer
        checked = set()
        for name, backend in config.backends.items():
            state = self.registry.states.get(name)
            if backend.spec.speculative and state is not None:
                checked.add(name)
                # in self.results before its answers are awaited: /routes shows the result
                # of a backend whose suspicion the check sets, from its first round on
                result = self.results.setdefault(name, CanaryResult())
                await self._check(config, name, state, result, plain)
        self.results = {n: r for n, r in self.results.items() if n in checked}
        self.rounds += 1
        self.last_round = time.time()

    async def _check(
        self,
        config: GatewayConfig,
        name: str,
        state: BackendState,
        result: CanaryResult,
        plain: dict[tuple[str, int], Generation | str],
    ) -> None:
        """One backend's part of a round (``plain`` caches the twins' answers)."""
        backend = config.backends[name]
        result.twin = plain_twin(config, self.registry, backend.served_model)
        if not state.available:
            result.note, result.counts = "backend unhealthy", Counter()
            return
        if result.twin is None:
            result.note = f"no healthy plain backend serves {backend.served_model!r}"
            result.counts = Counter()
            return
        verdicts = []
        for i in range(len(CANARY_PROMPTS)):
            key = (result.twin, i)
            if key not in plain:
                plain[key] = await self._generate(config.backends[result.twin], i)
            verdicts.append(self._verdict(plain[key], await self._generate(backend, i)))
        self._apply(name, state, result, verdicts)

    def _verdict(self, plain: Generation | str, spec: Generation | str) -> Verdict:
        if isinstance(plain, str):
            return Verdict("undecided", reason=f"plain twin: {plain}")
        if isinstance(spec, str):
            return Verdict("undecided", reason=f"speculative backend: {spec}")
        return compare(plain, spec, self.near_tie_margin)

    def _apply(
        self, name: str, state: BackendState, result: CanaryResult, verdicts: list[Verdict]
    ) -> None:
        """Record a round's verdicts and set or clear ``state.suspect``."""
        result.counts = Counter(v.kind for v in verdicts)
        result.totals.update(result.counts)
        diverged = [(i, v) for i, v in enumerate(verdicts) if v.position is not None]
        faults = [(i, v) for i, v in diverged if v.kind == "fault"]
        if diverged:
            i, v = (faults or diverged)[0]
            result.last_divergence = {"prompt": i, "time": time.time()} | asdict(v)
        undecided = [v.reason for v in verdicts if v.kind == "undecided"]
        result.note = f"undecided: {undecided[0]}" if undecided else None
        if faults:
            reason = suspect_reason(*faults[0])
            if state.suspect is None:
                logger.warning("backend %s is suspect: %s", name, reason)
            state.suspect = reason
        elif all(v.kind in ("matched", "near_tie") for v in verdicts):
            if state.suspect is not None:
                logger.info("backend %s passed the canary again; no longer suspect", name)
            state.suspect = None

    async def _generate(self, backend: BackendConfig, prompt: int) -> Generation | str:
        """One greedy completion of prompt index ``prompt``, or why there is none."""
        body = {
            "model": backend.served_model,
            "prompt": CANARY_PROMPTS[prompt],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "logprobs": 2,
            "return_token_ids": True,
        }
        answer = await post_completion(self.client, backend, body, self.timeout_s)
        if isinstance(answer, str):
            return answer
        try:
            return parse_completion(answer)
        except ValueError as exc:  # no token ids
            return f"unreadable answer ({exc})"

    def to_json(self) -> dict[str, Any]:
        """The canary's settings and per-backend results, for ``/routes``."""
        return {
            "interval_s": self.interval_s,
            "near_tie_margin": self.near_tie_margin,
            "max_tokens": self.max_tokens,
            "prompts": len(CANARY_PROMPTS),
            "rounds": self.rounds,
            "last_round": self.last_round,
            "backends": {name: r.to_json() for name, r in self.results.items()},
        }
