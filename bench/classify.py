"""Task classifier benchmark: held-out scores by shape and by item, latency.

    python -m bench.classify [--data DIR] [--folds 5] [--embedding DIR] [--no-latency]

Every dataset item is rebuilt in the request shapes of ``bench.shapes`` (the dataset's own,
context in the system message, XML document blocks, completion templates, context in an
earlier turn, multi-turn, content parts, tool-calling conversations). Prints per-class
precision/recall/F1, macro-F1 and the confusion matrix for:

- leave-one-shape-out: for each shape and each of ``--folds`` folds of items, the weights are
  refit on the other items in the other shapes and predict the held-out items in the held-out
  shape (neither the shape nor the item was seen);
- k-fold cross-validation by item: refit on the other folds' items (all shapes), predict the
  held-out items as the dataset gives them, and in every shape;
- the shipped weights (a training score: they saw every item).

Each held-out score is given for the fast stage alone and for the two stages: the second
stage's head (``bench.embed_fit``) is refit on the same training items as the fast stage in
every fold, and asked for the held-out requests whose fast-stage top probability is under
its threshold (the share asked is printed). The second stage needs the files of
``specgate models prepare`` (``--embedding DIR``, default the cache's); without them only the
fast stage is scored.

Then latency percentiles in microseconds, for the fast path and for the two stages. Timings are
reported, never asserted. The fits need the ``bench`` extra (numpy, scipy).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.classify_data import (
    DEFAULT_DATA,
    Item,
    Sample,
    Shaped,
    load_rows,
    samples_of,
    to_body,
    to_items,
)
from bench.shapes import SHAPES, shaped
from contracts.tasks import TASKS
from gateway.classify.classifier import (
    SHIPPED,
    TaskGuess,
    TaskModel,
    asks_second,
    classify,
    fixed_tasks,
    probabilities,
    with_prior,
)
from gateway.classify.embedding import SecondStage, combine
from gateway.classify.embedding_stage import load_stages

TARGET_F1, TARGET_CLASS_F1 = 0.92, 0.88


def predict(sample: Sample, model: TaskModel) -> str:
    """The most probable task of a sample under ``model``."""
    probs = probabilities(sample[0], sample[1], model)
    return max(probs, key=probs.__getitem__)


def scores(truth: Sequence[str], pred: Sequence[str]) -> dict[str, Any]:
    """Per-class precision/recall/F1, macro-F1, accuracy and the confusion matrix."""
    conf = {t: dict.fromkeys(TASKS, 0) for t in TASKS}
    for t, p in zip(truth, pred, strict=True):
        conf[t][p] += 1
    per: dict[str, tuple[float, float, float]] = {}
    for t in TASKS:
        tp = conf[t][t]
        prec = tp / max(sum(conf[o][t] for o in TASKS), 1)
        rec = tp / max(sum(conf[t].values()), 1)
        per[t] = (prec, rec, 2 * prec * rec / (prec + rec) if prec + rec else 0.0)
    acc = sum(conf[t][t] for t in TASKS) / max(len(truth), 1)
    return {"per": per, "macro_f1": statistics.fmean(f for _, _, f in per.values()),
            "accuracy": acc, "confusion": conf}  # fmt: skip


def print_scores(title: str, s: Mapping[str, Any]) -> None:
    """Print a score table as produced by ``scores``."""
    print(f"\n== {title}: macro-F1 {s['macro_f1']:.4f}, accuracy {s['accuracy']:.4f}")
    print(f"{'task':<10}{'prec':>8}{'recall':>8}{'F1':>8}")
    for t, (p, r, f) in s["per"].items():
        print(f"{t:<10}{p:>8.3f}{r:>8.3f}{f:>8.3f}")
    print("confusion (rows = truth, columns = predicted)")
    print(f"{'':<10}" + "".join(f"{t:>10}" for t in TASKS))
    for t in TASKS:
        print(f"{t:<10}" + "".join(f"{s['confusion'][t][p]:>10}" for p in TASKS))


def folds_of(items: Sequence[Item], k: int) -> list[int]:
    """Stratified fold index per item, by a stable hash of the id within each task."""
    fold = [0] * len(items)
    for task in TASKS:
        idx = [i for i, it in enumerate(items) if it[1] == task]
        idx.sort(key=lambda i: zlib.crc32(items[i][0].encode()))
        for rank, i in enumerate(idx):
            fold[i] = rank % k
    return fold


def folds_by_item(items: Sequence[Shaped], k: int) -> list[int]:
    """Fold of each shaped item: every shape of one dataset item falls in the same fold."""
    ids = sorted({(t, i) for i, t, _, _ in items})
    fold_of = dict(zip(ids, folds_of([(i, t, {}) for t, i in ids], k), strict=True))
    return [fold_of[(t, i)] for i, t, _, _ in items]


class HeldOut(NamedTuple):
    """Held-out predictions per shaped item: ``fast`` by the fast stage alone, ``two`` by the
    two stages (equal to ``fast`` without vectors), ``asked`` whether the second stage was."""

    fast: list[str]
    two: list[str]
    asked: list[bool]


def held_out(
    items: Sequence[Shaped],
    samples: Sequence[Sample],
    k: int,
    *,
    by_shape: bool,
    vectors: Any = None,
) -> HeldOut:
    """Held-out prediction of every shaped item: refit on the items of the other folds (and,
    ``by_shape``, in the other shapes only) and predict the held-out ones; ``vectors``: the
    items' pooled embeddings (``bench.embed_fit.embed_items``), whose head is refit on the
    same training items, or None."""
    from bench.classify_fit import fit  # needs numpy and scipy (the bench extra)
    from bench.embed_fit import THRESHOLD, fit_head, head_probabilities

    fold = folds_by_item(items, k)
    out = HeldOut([""] * len(items), [""] * len(items), [False] * len(items))
    for held_shape in SHAPES if by_shape else [None]:
        for f in range(k):
            train = [i for i, it in enumerate(items) if fold[i] != f and it[2] != held_shape]
            labels, groups = [items[i][1] for i in train], [items[i][0] for i in train]
            model = with_prior(fit([samples[i] for i in train], labels, groups))
            head = None if vectors is None else fit_head(vectors[train], labels, groups)
            test = [i for i, it in enumerate(items)
                    if fold[i] == f and (held_shape is None or it[2] == held_shape)]  # fmt: skip
            emb = None if head is None else head_probabilities(vectors[test], head)
            for row, i in enumerate(test):
                probs = probabilities(samples[i][0], samples[i][1], model)
                out.fast[i] = out.two[i] = max(probs, key=probs.__getitem__)
                fixed = fixed_tasks(samples[i][0])
                if emb is not None and asks_second(probs, fixed, THRESHOLD) and vectors[i].any():
                    other = dict(zip(TASKS, (float(v) for v in emb[row]), strict=True))
                    both = combine(probs, other, fixed)
                    out.two[i], out.asked[i] = max(both, key=both.__getitem__), True
    return out


def print_by_shape(items: Sequence[Shaped], pred: Sequence[str]) -> None:
    """Macro-F1 and accuracy per shape."""
    print(f"{'shape':<22}{'macro-F1':>9}{'accuracy':>9}   (n)")
    for name in SHAPES:
        idx = [i for i, it in enumerate(items) if it[2] == name]
        s = scores([items[i][1] for i in idx], [pred[i] for i in idx])
        print(f"{name:<22}{s['macro_f1']:>9.3f}{s['accuracy']:>9.3f}   ({len(idx)})")


def verdict(title: str, s: Mapping[str, Any]) -> str:
    """One line: does ``s`` meet the macro-F1 and per-class targets?"""
    worst = min(f for _, _, f in s["per"].values())
    ok = s["macro_f1"] >= TARGET_F1 and worst >= TARGET_CLASS_F1
    return (
        f"{title:<44} macro-F1 {s['macro_f1']:.3f} (>= {TARGET_F1}), lowest class F1 "
        f"{worst:.3f} (>= {TARGET_CLASS_F1}): {'met' if ok else 'NOT met'}"
    )


def percentiles(samples_ns: Sequence[int]) -> tuple[float, float]:
    """(p50, p99) in microseconds."""
    q = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return q[49] / 1000, q[98] / 1000


Timed = tuple[list[list[int]], list[bool]]  # ns per call per pass; second stage asked, per body


def time_passes(
    bodies: Sequence[Mapping[str, Any]], passes: int, second: SecondStage | None = None
) -> Timed:
    """Nanoseconds per ``classify`` call, per pass over ``bodies``, after a warm-up pass, and
    whether each body went to the second stage."""
    clock: Callable[[], int] = time.perf_counter_ns
    guesses: list[TaskGuess] = [classify(body, second=second) for body in bodies]
    out: list[list[int]] = []
    for _ in range(passes):
        samples: list[int] = []
        for body in bodies:
            t0 = clock()
            classify(body, second=second)
            samples.append(clock() - t0)
        out.append(samples)
    return out, [g.stage == "embedding" for g in guesses]


def print_latency(name: str, timed: Timed) -> None:
    """p50/p99 over every call, and of the quietest pass (lowest p99: least disturbed by other
    processes on a shared machine); with a second stage, also of the fast path (the calls it
    answered alone) and of the calls that asked the second stage, and their share."""
    passes, asked = timed
    p50, p99 = percentiles([t for samples in passes for t in samples])
    q50, q99 = min((percentiles(samples) for samples in passes), key=lambda q: q[1])
    print(
        f"{name:<34} p50 {p50:6.1f}  p99 {p99:7.1f}   quietest pass: p50 {q50:6.1f}  p99 {q99:6.1f}"
    )
    if any(asked) and len(asked) > 1:
        for label, want in (("fast path", False), ("second stage", True)):
            got = [t for samples in passes
                   for t, a in zip(samples, asked, strict=True) if a == want]  # fmt: skip
            if len(got) > 1:
                f50, f99 = percentiles(got)
                n = len(got) // len(passes)
                print(f"  {label:<32} p50 {f50:6.1f}  p99 {f99:7.1f}   ({n} calls per pass)")
        print(f"  share sent to the second stage: {sum(asked) / len(asked):.1%}")


def stretch(text: str, n: int) -> str:
    """``text`` repeated or cut to exactly ``n`` characters."""
    return (text * (n // max(len(text), 1) + 1))[:n]


def report_latency(
    items: Sequence[Item], rows: Sequence[Mapping[str, Any]], second: SecondStage | None
) -> None:
    """Print latency percentiles (microseconds per decision) for the dataset requests and
    every shape (fast stage alone, then both stages when ``second``), every prompt stretched to
    8,000 characters, and huge bodies."""
    print("== latency, microseconds per classify() call")
    every = [b for _, _, _, b in shaped(rows)]
    for stage, label in ((None, "fast stage only"), (second, "fast + embedding stage")):
        if stage is None and label != "fast stage only":
            print("(second stage: files absent, not timed)")
            continue
        print(f"-- {label}")
        data = [b for _, _, b in items]
        print_latency(f"dataset requests (n={len(items)})", time_passes(data, 10, stage))
        print_latency(f"every shape (n={len(every)})", time_passes(every, 3, stage))
    long8k = [to_body({**r, "prompt": stretch(r["prompt"], 8000)}) for r in rows]
    print("-- both stages when loaded")
    print_latency("prompts stretched to 8,000 chars", time_passes(long8k, 10, second))
    big = stretch(rows[0]["prompt"], 1_000_000)
    many = [{"role": "user", "content": "hello " * 50}] * 10_000
    for name, body in (("1 MB chat prompt", {"messages": [{"role": "user", "content": big}]}),
                       ("1 MB completions prompt", {"prompt": big}),
                       ("10,000 messages", {"messages": many})):  # fmt: skip
        print_latency(name, time_passes([body] * 50, 4, second))


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m bench.classify", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of *.jsonl prompts")
    ap.add_argument("--folds", type=int, default=5, help="cross-validation folds")
    ap.add_argument("--embedding", type=Path, default=None, help="second-stage files folder")
    ap.add_argument("--no-latency", action="store_true", help="skip the timing section")
    args = ap.parse_args(argv)
    from bench.embed_fit import default_folder, embed_items

    rows = load_rows(args.data)
    if not rows:
        raise SystemExit(f"no *.jsonl prompts under {args.data}")
    items = shaped(rows)
    truth = [t for _, t, _, _ in items]
    samples = samples_of(items)
    plain = [i for i, it in enumerate(items) if it[2] == "plain"]
    print(f"{len(rows)} prompts from {args.data}, {len(SHAPES)} shapes: {', '.join(SHAPES)}")
    second = load_stages(args.embedding or default_folder()).second
    vectors = None if second is None else embed_items(items, second.vectors)
    if vectors is None:
        print("second stage: files absent (run `specgate models prepare`): fast stage only")

    loso = held_out(items, samples, args.folds, by_shape=True, vectors=vectors)
    cv = held_out(items, samples, args.folds, by_shape=False, vectors=vectors)
    results: list[tuple[str, Mapping[str, Any]]] = []
    for stage, pick in (("fast stage", 0), ("two stages", 1)):
        if pick and vectors is None:
            continue
        lo, c = loso[pick], cv[pick]
        print(f"\n######## {stage}")
        s_loso = scores(truth, lo)
        print_scores(f"{stage}: leave-one-shape-out x {args.folds} folds of items", s_loso)
        print_by_shape(items, lo)
        s_cv = scores([truth[i] for i in plain], [c[i] for i in plain])
        print_scores(f"{stage}: {args.folds}-fold CV by item, the dataset's shape", s_cv)
        s_cv_all = scores(truth, c)
        print_scores(f"{stage}: {args.folds}-fold CV by item, every shape", s_cv_all)
        results += [(f"{stage}, leave-one-shape-out", s_loso),
                    (f"{stage}, {args.folds}-fold CV (dataset shape)", s_cv),
                    (f"{stage}, {args.folds}-fold CV (every shape)", s_cv_all)]  # fmt: skip
        if pick:
            for name, ho in (("leave-one-shape-out", loso), ("cross-validation", cv)):
                print(f"second stage asked ({name}): {sum(ho.asked) / len(ho.asked):.1%}")

    shipped = [predict(x, SHIPPED) for x in samples]
    s_shipped = scores([truth[i] for i in plain], [shipped[i] for i in plain])
    print_scores("shipped fast-stage weights, the dataset's shape (training score)", s_shipped)
    print_by_shape(items, shipped)

    print("\n== targets")
    for title, s in results:
        print(verdict(title, s))
    if not args.no_latency:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\n(Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load})")
        report_latency(to_items(rows), rows, second)


if __name__ == "__main__":
    main()
