"""Calibrate the simulated vLLM backend against the cost twin's measurement.

    python -m bench.sim_calibrate [--scale 0.5] [--fit] [--profile P] [--per-task N]
                                  [--against RESULTS.json ...] [--out bench/out/sim-calibrate]

Replays the twin run's workload (``bench.speedup`` as run on the GPU: the same prompts, the
profile's ``per_task`` a task unless ``--per-task`` says (16 in the 2026-12-01 H200 run of the
default profile, 12 in the 2026-12-05 H100 one, ``bench/sim/twin-2026-12-05-h100.json``), 64
output tokens max, waves of c requests, each backend alone, c = 1 to 64) on simulated engines
(:mod:`bench.sim.engine`, in process, no HTTP), each kind on its own simulated GPU as it was
measured, and compares per cell the speculative/plain ratio of output tokens/s per request (sum
of tokens over sum of end-to-end times, as ``bench.speedup``) with the measured one. Times are
taken on the simulated clock, so ``--scale`` (real seconds per simulated second) changes the
wall time only, not the figures (up to loop lateness).

``--fit`` first fits the step-time curve (``step_ms``, one point per concurrency c at batch
c, starting from the measured decode time per step, ``observed_step_ms``, see
:mod:`bench.sim.derive`): each point is scaled by simulated/measured tokens/s of each
backend alone at that c (mean over tasks), 4 rounds, and the result is written back to the
profile file. The fit absorbs what the model leaves out (a wave's batch shrinks as its
requests finish, prefills interleave), so ``step_ms`` is an effective step time by
concurrency, not a kernel time; the report shows both.

``--against`` compares with another run's ``bench.speedup`` results (its repeats pooled,
:func:`bench.sim.derive.pooled`; its prompts a task replayed) instead of the run the profile
was fitted to: how the profile predicts a run it was not fitted to (docs/benchmarks.md
section 7b, session 27), on the concurrencies that run measured (session 30's: 4, 8, 16),
its waves dealt as that run dealt them (``--waves per-task``, session 33: one task a wave).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from bench.sim.book import book_for, prompt_text
from bench.sim.derive import derive, pooled
from bench.sim.engine import Clock, Engine, Gpu, PromptBook, SimRequest
from bench.sim.profile import TWIN_PROFILE, SimProfile, load_profile, parse_profile
from bench.workloads import Item, default_prompts_dir, sample, waves

CONCURRENCIES = (1, 4, 8, 16, 32, 64)
TASKS = ("code", "rag", "chat", "creative")
SPECULATIVE = ("ngram", "eagle3")
#: The twin runs' output tokens (docs/benchmarks.md section 7); prompts a task come from
#: the profile (``per_task``) unless ``--per-task`` says.
MAX_TOKENS = 64


def chars_to_tokens(chars: int) -> int:
    """Prompt tokens from characters: 4 characters a token (English text, SmolLM2's BPE)."""
    return max(1, chars // 4)


async def _one(engine: Engine, book: PromptBook, item: Item) -> tuple[str, int, float]:
    key, _task, natural = book.lookup(prompt_text(item))
    req = SimRequest(
        task=item.task,
        temperature=float(item.body.get("temperature", 1.0)),
        prompt_tokens=chars_to_tokens(item.prompt_chars),
        target=min(MAX_TOKENS, natural),
        prompt_key=key,
    )
    async for _n in engine.generate(req):
        pass
    assert req.finished_at is not None
    return item.task, req.produced, req.finished_at - req.arrival


Cells = dict[int, dict[str, float]]


async def replay_kind(
    profile: SimProfile,
    kind: str,
    items: Sequence[Item],
    book: PromptBook,
    clock: Clock,
    concurrencies: Sequence[int] = CONCURRENCIES,
    dealing: str = "mixed",
    prefix_cache: bool = True,
) -> Cells:
    """tokens/s per request by concurrency and task for ``kind`` alone on its own GPU, the
    items dealt into waves as ``bench.speedup --waves`` deals them
    (:func:`bench.workloads.waves`: ``mixed`` or ``per-task``), the server's prefix cache on
    or off (``bench.speedup --no-prefix-cache``)."""
    engine = Engine(
        kind,
        profile.kinds[kind],
        Gpu(clock),
        plain=profile.kinds["plain"],
        prefix_cache=prefix_cache,
    )
    for item in items[:2]:  # bench.speedup's warm-up
        await _one(engine, book, item)
    out: Cells = {}
    try:
        for c in concurrencies:
            done: list[tuple[str, int, float]] = []
            for wave in waves(items, c, dealing):
                done += await asyncio.gather(*(_one(engine, book, it) for it in wave))
                await clock.sleep_until(clock.now() + 0.05)  # --settle 0.05
            out[c] = {
                t: sum(d[1] for d in done if d[0] == t) / sum(d[2] for d in done if d[0] == t)
                for t in TASKS
            }
    finally:
        await engine.close()
    return out


async def replay(
    profile: SimProfile,
    items: Sequence[Item],
    scale: float,
    concurrencies: Sequence[int] = CONCURRENCIES,
    dealing: str = "mixed",
    prefix_cache: bool = True,
) -> dict[str, Cells]:
    """Every kind's cells at ``concurrencies``, the kinds run side by side (each on its own
    simulated GPU), waves dealt by ``dealing``, prefix caches on or off (:func:`replay_kind`)."""
    clock = Clock(scale)
    book = book_for(profile, items)
    kinds = list(profile.kinds)
    runs = await asyncio.gather(
        *(
            replay_kind(profile, k, items, book, clock, concurrencies, dealing, prefix_cache)
            for k in kinds
        )
    )
    return dict(zip(kinds, runs, strict=True))


def ratios(
    cells: dict[str, Cells], concurrencies: Sequence[int] = CONCURRENCIES
) -> dict[tuple[str, int, str], float]:
    """Speculative/plain tokens/s per (kind, c, task)."""
    return {
        (kind, c, t): cells[kind][c][t] / cells["plain"][c][t]
        for kind in SPECULATIVE
        for c in concurrencies
        for t in TASKS
    }


def table(
    simulated: dict[str, dict[int, dict[str, float]]],
    measured: dict[str, dict[int, dict[str, float]]],
    concurrencies: Sequence[int] = CONCURRENCIES,
) -> tuple[str, float, int]:
    """The markdown table of simulated vs measured ratios at ``concurrencies``, the largest
    relative error and the count of cells within 15%."""
    sim, real = ratios(simulated, concurrencies), ratios(measured, concurrencies)
    lines = [
        "| backend | task | " + " | ".join(f"c={c}" for c in concurrencies) + " |",
        "|---|---|" + "---|" * len(concurrencies),
    ]
    worst, within = 0.0, 0
    for kind in SPECULATIVE:
        for t in TASKS:
            row = []
            for c in concurrencies:
                s, m = sim[(kind, c, t)], real[(kind, c, t)]
                err = s / m - 1
                worst = max(worst, abs(err))
                within += abs(err) <= 0.15
                row.append(f"{s:.2f} / {m:.2f}" + ("" if abs(err) <= 0.15 else " **x**"))
            lines.append(f"| {kind} | {t} | " + " | ".join(row) + " |")
    return "\n".join(lines), worst, within


def fit_steps(profile: SimProfile, simulated: dict[str, Cells]) -> SimProfile:
    """``profile`` with each kind's step time at each concurrency (the point at batch = c)
    scaled by simulated/measured tokens/s there (mean over tasks)."""
    kinds = {}
    for name, kind in profile.kinds.items():
        points = []
        for c, ms in kind.cost.step_ms:
            factor = statistics.mean(
                simulated[name][int(c)][t] / profile.measured[name][int(c)][t] for t in TASKS
            )
            points.append((c, round(ms * factor, 3)))
        kinds[name] = replace(kind, cost=replace(kind.cost, step_ms=tuple(points)))
    return replace(profile, kinds=kinds)


class Against(NamedTuple):
    """A run of ``bench.speedup`` to compare with (another run, or the one the profile was
    fitted to): its measured cells (``measured[kind][c][task]``, output tokens/s per
    request), its prompts a task, the concurrencies of :data:`CONCURRENCIES` it measured, its
    dealing (``--waves``: ``mixed``, or ``per-task`` since session 33) and whether its
    servers had prefix caching (``--no-prefix-cache``)."""

    measured: dict[str, Cells]
    per_task: int
    concurrencies: list[int]
    dealing: str
    prefix_cache: bool


def against(paths: Sequence[Path]) -> Against:
    """Another run's ``bench.speedup`` results, its repeats pooled (total over total, as a
    profile's own: :func:`bench.sim.derive.derive`); a run may leave some concurrencies out,
    as ``CONCURRENCY=4,8,16`` in session 30. Raises OSError, ValueError (not JSON, none of
    our concurrencies, or repeats dealt or cached differently), KeyError, IndexError (no run)
    or ZeroDivisionError (a cell without an answered request, a backend's cell at a measured
    concurrency missing included: ``derive`` computes every one) on what is not such
    results."""
    results = [json.loads(path.read_text()) for path in paths]
    metas = [r.get("meta", {}) for r in results]
    setups = {(m.get("waves", "mixed"), m.get("prefix_cache", True)) for m in metas}
    if len(setups) != 1:
        raise ValueError(f"(waves, prefix cache) {sorted(setups)}: repeats set up alike only")
    run = parse_profile(derive(pooled(results)))
    measured = [c for c in CONCURRENCIES if c in run.measured["plain"]]
    if not measured:
        raise ValueError(f"no plain at any of c={', '.join(map(str, CONCURRENCIES))}")
    dealing, prefix_cache = setups.pop()
    return Against(run.measured, run.per_task, measured, dealing, bool(prefix_cache))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the calibration; returns 0 when every cell is within 15%, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=TWIN_PROFILE)
    parser.add_argument("--prompts", type=Path, default=default_prompts_dir())
    parser.add_argument("--scale", type=float, default=0.5, help="real s per simulated s")
    parser.add_argument("--fit", action="store_true", help="fit step times, write the profile")
    parser.add_argument(
        "--per-task",
        type=int,
        default=None,
        help="prompts a task (default: the compared run's, 16 on 2026-12-01, 12 on 12-05)",
    )
    parser.add_argument(
        "--against",
        type=Path,
        nargs="+",
        help="bench.speedup results.json of another run (repeats pooled, total over total) "
        "to compare with on the concurrencies it measured, instead of the run the profile was "
        "fitted to (out of sample)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/sim-calibrate"))
    args = parser.parse_args(argv)
    if args.fit and args.against:
        parser.error("--fit fits the profile to its own run: not with --against")
    profile = load_profile(args.profile)
    run = Against(profile.measured, profile.per_task, list(CONCURRENCIES), "mixed", True)
    compared = "the profile's own run"
    if args.against:
        try:
            run = against(args.against)
        except (OSError, ValueError, LookupError, TypeError, ArithmeticError) as error:
            parser.error(
                f"--against: not bench.speedup results of every cell at its concurrencies "
                f"({error!r})"
            )
        compared = ", ".join(map(str, args.against))
    items = sample(args.prompts, args.per_task or run.per_task)
    started = time.monotonic()
    simulated = asyncio.run(
        replay(profile, items, args.scale, run.concurrencies, run.dealing, run.prefix_cache)
    )
    if args.fit:
        for _ in range(4):
            profile = fit_steps(profile, simulated)
            simulated = asyncio.run(replay(profile, items, args.scale))
        args.profile.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    text, worst, within = table(simulated, run.measured, run.concurrencies)
    total = len(SPECULATIVE) * len(TASKS) * len(run.concurrencies)
    report = (
        f"Speculative / plain, output tokens/s per request, simulated / measured "
        f"(**x**: off by more than 15%):\n\n{text}\n\n{within} of {total} cells within 15%; "
        f"largest error {worst:.0%}; {time.monotonic() - started:.0f} s at scale {args.scale}; "
        f"{run.dealing} waves{'' if run.prefix_cache else ', no prefix cache'}; "
        f"measured: {compared}.\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.md").write_text(report)
    (args.out / "calibration.json").write_text(
        json.dumps({k: {str(c): v for c, v in by.items()} for k, by in simulated.items()})
    )
    print(report)
    return 0 if within == total else 1


if __name__ == "__main__":
    sys.exit(main())
