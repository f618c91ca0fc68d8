"""From finished requests to the adaptive learner: observations and a log of recent records.

One :class:`FeedbackCollector` lives on the :class:`~gateway.service.Gateway` (not on the
routing policy, which a config reload replaces), so what was learnt survives reloads;
:mod:`gateway.persistence` saves it across restarts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from contracts.config import AdaptiveSettings
from gateway.routing.adaptive import Learner, Observation, bucket_of
from gateway.trace import RequestTrace

#: Records kept for ``GET /routes`` (the newest last).
RECENT = 200


class FeedbackCollector:
    """Request-trace observer feeding the :class:`~gateway.routing.adaptive.Learner`.

    ``settings`` is a callable so a reloaded config's knobs apply. A request teaches when it
    succeeded (200) with at least ``min_tokens`` output tokens; every such request is also
    kept in :attr:`recent` (numbers only, never text). One that shared its compute with
    another server of ours (``trace.shared``) teaches nothing and is counted in
    :attr:`shared`.
    """

    def __init__(self, settings: Callable[[], AdaptiveSettings]) -> None:
        self.settings = settings
        self.learner = Learner(settings().decay)
        self.recent: deque[_Recent] = deque(maxlen=RECENT)
        self.ignored = 0
        self.shared = 0

    def bucket(self, trace: RequestTrace) -> str | None:
        """The feature bucket of a traced request (None without routing features)."""
        if trace.features is None:
            return None
        overlap = trace.prompt.overlap if trace.prompt is not None else None
        threshold = self.settings().overlap_threshold
        return bucket_of(trace.features.temperature, overlap, threshold, trace.concurrency)

    def observe(self, trace: RequestTrace) -> None:
        """Observer: learn from one finished request (ignored when it teaches nothing)."""
        settings = self.settings()
        # The speed is the client's: output tokens over the whole request, time to first
        # token included (a stream's and a JSON answer's on one scale), as bench.speedup and
        # issue #25's oracle measure it. Under load most of the difference between backends
        # is in the first token (docs/benchmarks.md, section 7, "Session 11": on simulated
        # H200s at 32 requests each, EAGLE-3's first token came 114 ms after plain's, its
        # other tokens 0.6 ms each later; learnt on the tokens after the first, it kept
        # winning code).
        bucket, tokens, seconds = self.bucket(trace), trace.completion_tokens(), None
        if trace.status == 200 and trace.error is None:
            seconds = trace.duration_s
        if (
            bucket is None
            or trace.backend is None
            or trace.task is None
            or seconds is None
            or seconds <= 0
            or tokens is None
            or tokens < settings.min_tokens
        ):
            self.ignored += 1
            return
        if trace.shared:
            self.shared += 1
            return
        spec = trace.spec_decoding or {}
        drafts, accepted = spec.get("num_draft_tokens"), spec.get("num_accepted_draft_tokens")
        steps = spec.get("num_spec_steps")
        obs = Observation(
            trace.task,
            bucket,
            trace.backend,
            tokens / seconds,
            tokens,
            drafts if isinstance(drafts, int) else None,
            accepted if isinstance(accepted, int) else None,
            steps if isinstance(steps, int) else None,
        )
        self.learner.decay = settings.decay
        self.learner.observe(obs)
        self.recent.append(_Recent(trace, obs))  # rendered when /routes asks

    def records(self, last: int = RECENT) -> list[dict[str, Any]]:
        """The newest ``last`` requests that taught the learner, oldest first, as
        ``GET /routes`` shows them (numbers only, never text)."""
        return [_record(*r) for r in list(self.recent)[-last:]]

    def to_json(self) -> dict[str, Any]:
        """The learner's estimates and the newest records, for ``GET /routes``."""
        return {
            "observations": self.learner.observations,
            "ignored": self.ignored,
            "shared": self.shared,
            "decay": self.learner.decay,
            "groups": self.learner.summary(),
            "recent": self.records(50),
        }


class _Recent(NamedTuple):
    """A request that taught the learner, kept as is (no per-request formatting)."""

    trace: RequestTrace
    obs: Observation


def _record(trace: RequestTrace, obs: Observation) -> dict[str, Any]:
    features, prompt, spec = trace.features, trace.prompt, trace.spec_decoding
    rate = None
    if obs.draft_tokens and obs.accepted_tokens is not None:
        rate = obs.accepted_tokens / obs.draft_tokens
    return {
        "request_id": trace.request_id,
        "backend": obs.backend,
        "task": obs.task,
        "bucket": obs.bucket,
        "temperature": features.temperature if features else None,
        "prompt_chars": prompt.chars if prompt else None,
        "prompt_overlap": prompt.overlap if prompt else None,
        "stream": trace.stream,
        "tokens": obs.tokens,
        "seconds": round(obs.tokens / obs.speed_tps, 4),
        "tps": round(obs.speed_tps, 2),
        "draft_tokens": obs.draft_tokens,
        "accepted_tokens": obs.accepted_tokens,
        "acceptance_rate": rate,
        "mean_acceptance_length": spec.get("mean_acceptance_length") if spec else None,
        "speculative_decoding": spec,
    }
