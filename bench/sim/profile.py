"""The cost model of a simulated vLLM server, fitted to a GPU measurement (the cost twin).

A :class:`SimProfile` holds, per backend kind (``plain``, ``ngram``, ``eagle3``), a
:class:`StepCost` (decode step time by batch size, first-token latency, serial admission
cost, prefill cost per prompt token) and an :class:`AcceptanceModel` (per task: the share of
steps that draft, and the probability that each drafted token is accepted given the one before
was, at the temperature the task was measured at), plus the natural output length of the
prompts it was measured on. Loaded from ``bench/sim/twin-2026-12-01.json``, which
``python -m bench.sim.derive`` wrote from the twin run's ``results.json`` (docs/benchmarks.md
section 7) and ``python -m bench.sim_calibrate --fit`` tuned.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The profile fitted to the cost twin on one H200 (vLLM 0.26.0, 2026-12-01).
TWIN_PROFILE = Path(__file__).with_name("twin-2026-12-01.json")


def interpolate(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear ``y(x)`` through ``points`` (sorted by x), extended linearly past
    the last two points and held flat below the first."""
    xs = [p[0] for p in points]
    if x <= xs[0] or len(points) == 1:
        return points[0][1]
    i = min(bisect.bisect_left(xs, x), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class StepCost:
    """What a server's work costs, in simulated milliseconds.

    ``step_ms``: (requests in the server, step time) points, with the kind's speculative
    tokens (``k``) drafted and verified for each running request; indexed by the requests
    in the server (arrived and not finished, running or not), the load a step was measured
    under at that concurrency, so the front end's work for queued requests (which shares the
    host with the engine) is folded in; fitted by :mod:`bench.sim_calibrate` from
    ``observed_step_ms``: (concurrency, decode time per step the requests saw) in the
    measurement; ``latency_ms``: fixed time from
    arrival to the scheduler (HTTP, tokenization, detokenization; parallel across requests);
    ``admit_ms``: serial front-end time per request (one request after another, so a wave of
    c requests waits up to c x admit_ms); ``prefill_ms_per_token``: GPU time per uncached
    prompt token, added to the step that prefills it; ``host_share``: the part of a step that
    does not hold the GPU (CPU scheduling and drafting; 0 puts the whole step on the GPU).
    """

    k: int
    step_ms: tuple[tuple[float, float], ...]
    latency_ms: float
    admit_ms: float
    prefill_ms_per_token: float
    host_share: float = 0.0
    observed_step_ms: tuple[tuple[float, float], ...] = ()

    def step(self, batch: int, k: int | None = None, plain: StepCost | None = None) -> float:
        """Step time (ms) with ``batch`` requests in the server. With ``k`` other than the
        fitted one and the ``plain`` kind's cost given, the speculative overhead over plain
        is scaled by ``k / self.k`` (an assumption: drafting and verifying cost in proportion
        to the tokens drafted; only the fitted k was measured)."""
        ms = interpolate(self.step_ms, batch)
        if k is None or k == self.k or plain is None or self.k == 0:
            return ms
        base = interpolate(plain.step_ms, batch)
        return base + (ms - base) * k / self.k


@dataclass(frozen=True)
class AcceptanceModel:
    """Per task: ``draft_share`` (share of a request's steps that draft: 1 for EAGLE-3; for
    ngram the steps whose recent tokens match the prompt) and ``accept`` (probability that a
    drafted token is accepted given the previous one was, at the task's measured temperature;
    accepted length per drafting step is geometric, truncated at k, which matches vLLM's
    per-position acceptance logs of the twin run: 0.61, 0.43, 0.28 for EAGLE-3 k=3).

    Temperature: ``temperature_curve`` gives acceptance relative to greedy by temperature
    (points of the self-drafting 135M on the twin, ../shared/notes/gpu-costtwin.md: 0.975 at
    T=0, 0.40 at 0.7, 0.13 at 1.0, normalised); a request at another temperature than its
    task's measured one gets ``accept x curve(T) / curve(T_measured)``, capped at 0.98.
    """

    draft_share: dict[str, float]
    accept: dict[str, float]
    measured_temperature: dict[str, float]
    temperature_curve: tuple[tuple[float, float], ...]

    def per_token(self, task: str, temperature: float) -> tuple[float, float]:
        """(draft share, conditional acceptance) for a request of ``task`` at
        ``temperature``; an unknown task is treated as ``chat``."""
        task = task if task in self.accept else "chat"
        measured = self.measured_temperature.get(task, temperature)
        scale = interpolate(self.temperature_curve, temperature) / max(
            interpolate(self.temperature_curve, measured), 1e-6
        )
        return self.draft_share[task], min(0.98, self.accept[task] * scale)


@dataclass(frozen=True)
class KindProfile:
    """One backend kind: its speculation method (``none``, ``ngram``, ``eagle3``), cost and
    acceptance."""

    method: str
    cost: StepCost
    acceptance: AcceptanceModel | None


@dataclass(frozen=True)
class SimProfile:
    """Every kind's model, the output lengths by prompt id and task, and the measurement it
    was fitted to (``measured[kind][concurrency][task]`` = output tokens/s per request) with
    its prompts a task (``per_task``; 16 when a profile does not say)."""

    kinds: dict[str, KindProfile]
    lengths: dict[str, int]
    task_lengths: dict[str, tuple[int, ...]]
    temperatures: dict[str, float]
    measured: dict[str, dict[int, dict[str, float]]]
    source: str
    #: Prompts a task in the run it was fitted to (what ``bench.sim_calibrate`` replays).
    per_task: int = 16

    def to_json(self) -> dict[str, Any]:
        """The JSON form :func:`load_profile` reads."""
        kinds: dict[str, Any] = {}
        for name, kind in self.kinds.items():
            c = kind.cost
            entry: dict[str, Any] = {
                "method": kind.method,
                "k": c.k,
                "step_ms": [list(p) for p in c.step_ms],
                "observed_step_ms": [list(p) for p in c.observed_step_ms],
                "latency_ms": c.latency_ms,
                "admit_ms": c.admit_ms,
                "prefill_ms_per_token": c.prefill_ms_per_token,
                "host_share": c.host_share,
            }
            if kind.acceptance is not None:
                entry["draft_share"] = kind.acceptance.draft_share
                entry["accept"] = kind.acceptance.accept
            kinds[name] = entry
        curve = next(
            (k.acceptance.temperature_curve for k in self.kinds.values() if k.acceptance), ()
        )
        return {
            "source": self.source,
            "per_task": self.per_task,
            "temperatures": self.temperatures,
            "temperature_curve": [list(p) for p in curve],
            "kinds": kinds,
            "lengths": self.lengths,
            "measured": {
                kind: {str(c): cells for c, cells in by_c.items()}
                for kind, by_c in self.measured.items()
            },
        }


def parse_profile(data: dict[str, Any]) -> SimProfile:
    """A :class:`SimProfile` from its JSON form. Raises KeyError or ValueError on a bad
    document."""
    temperatures = {t: float(v) for t, v in data["temperatures"].items()}
    curve = tuple((float(a), float(b)) for a, b in data["temperature_curve"])
    kinds = {}
    for name, k in data["kinds"].items():
        cost = StepCost(
            k=int(k["k"]),
            step_ms=tuple((float(a), float(b)) for a, b in k["step_ms"]),
            latency_ms=float(k["latency_ms"]),
            admit_ms=float(k["admit_ms"]),
            prefill_ms_per_token=float(k["prefill_ms_per_token"]),
            host_share=float(k.get("host_share", 0.0)),
            observed_step_ms=tuple(
                (float(a), float(b)) for a, b in k.get("observed_step_ms", k["step_ms"])
            ),
        )
        acceptance = None
        if "accept" in k:
            acceptance = AcceptanceModel(
                draft_share={t: float(v) for t, v in k["draft_share"].items()},
                accept={t: float(v) for t, v in k["accept"].items()},
                measured_temperature=temperatures,
                temperature_curve=curve,
            )
        kinds[name] = KindProfile(str(k["method"]), cost, acceptance)
    lengths = {i: int(n) for i, n in data["lengths"].items()}
    by_task: dict[str, list[int]] = {}
    for item_id, n in sorted(lengths.items()):
        by_task.setdefault(item_id.split("-", 1)[0], []).append(n)
    return SimProfile(
        kinds=kinds,
        lengths=lengths,
        task_lengths={t: tuple(v) for t, v in by_task.items()},
        temperatures=temperatures,
        measured={
            kind: {int(c): cells for c, cells in by_c.items()}
            for kind, by_c in data.get("measured", {}).items()
        },
        source=str(data.get("source", "")),
        per_task=int(data.get("per_task", 16)),
    )


def load_profile(path: Path = TWIN_PROFILE) -> SimProfile:
    """Read a profile file (default: the twin's)."""
    return parse_profile(json.loads(path.read_text()))
