"""Task classifier benchmark: accuracy on the prompt datasets, held-out scores, latency.

    python -m bench.classify [--data DIR] [--folds 5] [--fit] [--no-latency]

Each dataset item's ``prompt`` becomes the request a client would send: HumanEval stubs
(``prompt_format: "completion"``) a ``/v1/completions`` body, everything else one chat user
message. Prints, for the shipped weights, per-class precision/recall/F1, macro-F1 and the
confusion matrix (a training score: the fitted weights saw every item); the same for k-fold
cross-validation, the weights refit on the training folds only (the honest estimate);
accuracy on request shapes the dataset lacks, rebuilt from its items (RAG context in a system
message or an earlier turn, a generic system prompt, the multi-turn items as conversations);
and latency percentiles in microseconds. ``--fit`` prints weights fitted on every item, to
paste into ``gateway.routing.classifier``. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.classify_fit import FITTED, Model, fit, predict
from gateway.routing.classifier import TASKS, classify, extract_features

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "prompts"
Item = tuple[str, str, dict[str, Any]]  # (id, task, request body)


def load_rows(data: Path) -> list[dict[str, Any]]:
    """All JSON lines of ``data/*.jsonl`` (each with ``task`` and ``prompt``)."""
    rows: list[dict[str, Any]] = []
    for path in sorted(data.glob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows


def to_body(row: Mapping[str, Any], *, turns: bool = False) -> dict[str, Any]:
    """The request body a client would send for a dataset row.

    HumanEval stubs become a completions ``prompt``, anything else a chat user message. With
    ``turns``, a multi-turn item becomes its user turns separated by (empty) assistant turns.
    """
    if row.get("prompt_format") == "completion":
        return {"model": "m", "prompt": row["prompt"], "max_tokens": 256}
    messages: list[dict[str, str]] = []
    for i, turn in enumerate((row.get("turns") if turns else None) or [row["prompt"]]):
        if i:
            messages.append({"role": "assistant", "content": ""})
        messages.append({"role": "user", "content": turn})
    return {"model": "m", "messages": messages}


def to_items(rows: Iterable[Mapping[str, Any]]) -> list[Item]:
    """(id, task, body) for every row."""
    return [(str(r["id"]), str(r["task"]), to_body(r)) for r in rows]


def shape_variants(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Item]]:
    """Request shapes absent from the dataset, rebuilt from its items (not used for fitting).

    rag_system: an instruction and the passages in the system message, the question as the
    user message; rag_bare: bare passages as the system message; rag_turn: passages pasted in
    an earlier user turn; with_system: every chat-shaped item behind a generic system prompt;
    multi_turn: the items that have ``turns``, sent as a conversation (the assistant's
    answers are not in the dataset, so they are left empty).
    """
    generic = {"role": "system", "content": "You are a helpful assistant."}
    names = ("rag_system", "rag_bare", "rag_turn", "with_system", "multi_turn")
    out: dict[str, list[Item]] = {k: [] for k in names}
    for r in rows:
        rid, task = str(r["id"]), str(r["task"])
        if task == "rag" and isinstance(r.get("context"), list):
            docs = "\n\n".join(f"{d.get('title', '')}\n{d.get('text', '')}" for d in r["context"])
            q = {"role": "user", "content": r["question"]}
            intro = "Answer the user's question using only the context below.\n\nContext:\n"
            shapes = {
                "rag_system": [{"role": "system", "content": intro + docs}, q],
                "rag_bare": [{"role": "system", "content": docs}, q],
                "rag_turn": [{"role": "user", "content": "Here is some background:\n\n" + docs},
                             {"role": "assistant", "content": "Thanks, I have read it."}, q],
            }  # fmt: skip
            for name, messages in shapes.items():
                out[name].append((rid, task, {"messages": messages}))
        body = to_body(r)
        if "messages" in body:
            out["with_system"].append((rid, task, {"messages": [generic, *body["messages"]]}))
        if r.get("turns"):
            out["multi_turn"].append((rid, task, to_body(r, turns=True)))
    return out


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


def cross_validate(items: Sequence[Item], k: int) -> tuple[list[str], list[str]]:
    """Held-out predictions: for each fold, fit on the others and predict it."""
    feats = [extract_features(body) or {} for _, _, body in items]
    fold = folds_of(items, k)
    pred = [""] * len(items)
    for f in range(k):
        train = [i for i in range(len(items)) if fold[i] != f]
        model = fit([feats[i] for i in train], [items[i][1] for i in train])
        for i in range(len(items)):
            if fold[i] == f:
                pred[i] = predict(feats[i], model)
    return [t for _, t, _ in items], pred


def percentiles(samples_ns: Sequence[int]) -> tuple[float, float]:
    """(p50, p99) in microseconds."""
    q = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return q[49] / 1000, q[98] / 1000


def time_passes(bodies: Sequence[Mapping[str, Any]], passes: int) -> list[list[int]]:
    """Nanoseconds per ``classify`` call, per pass over ``bodies``, after a warm-up pass."""
    clock: Callable[[], int] = time.perf_counter_ns
    for body in bodies:
        classify(body)
    out: list[list[int]] = []
    for _ in range(passes):
        samples: list[int] = []
        for body in bodies:
            t0 = clock()
            classify(body)
            samples.append(clock() - t0)
        out.append(samples)
    return out


def print_latency(name: str, passes: Sequence[Sequence[int]]) -> None:
    """p50/p99 over every call, and of the quietest pass (lowest p99: least disturbed by other
    processes on a shared machine)."""
    p50, p99 = percentiles([t for samples in passes for t in samples])
    q50, q99 = min((percentiles(samples) for samples in passes), key=lambda q: q[1])
    print(
        f"{name:<34} p50 {p50:6.1f}  p99 {p99:7.1f}   quietest pass: p50 {q50:6.1f}  p99 {q99:6.1f}"
    )


def stretch(text: str, n: int) -> str:
    """``text`` repeated or cut to exactly ``n`` characters."""
    return (text * (n // max(len(text), 1) + 1))[:n]


def report_latency(items: Sequence[Item], rows: Sequence[Mapping[str, Any]]) -> None:
    """Print latency percentiles (microseconds per decision) for the dataset requests, every
    prompt stretched to 8,000 characters, and huge bodies."""
    print("== latency, microseconds per classify() call")
    print_latency(f"dataset requests (n={len(items)})", time_passes([b for _, _, b in items], 10))
    long8k = [to_body({**r, "prompt": stretch(r["prompt"], 8000)}) for r in rows]
    print_latency("prompts stretched to 8,000 chars", time_passes(long8k, 10))
    big = stretch(rows[0]["prompt"], 1_000_000)
    many = [{"role": "user", "content": "hello " * 50}] * 10_000
    for name, body in (("1 MB chat prompt", {"messages": [{"role": "user", "content": big}]}),
                       ("1 MB completions prompt", {"prompt": big}),
                       ("10,000 messages", {"messages": many})):  # fmt: skip
        print_latency(name, time_passes([body] * 50, 4))


def print_weights(model: Model) -> None:
    """Print ``model`` as the BIAS / WEIGHTS constants of gateway.routing.classifier."""
    print("BIAS: tuple[float, float] = (" + ", ".join(f"{b:.3f}" for b in model[0]) + ")")
    print("WEIGHTS: dict[str, tuple[float, float]] = {")
    for name in FITTED:
        print(f'    "{name}": (' + ", ".join(f"{w:.3f}" for w in model[1][name]) + "),")
    print("}")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m bench.classify", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of *.jsonl prompts")
    ap.add_argument("--folds", type=int, default=5, help="cross-validation folds")
    ap.add_argument("--fit", action="store_true", help="print weights fitted on all items")
    ap.add_argument("--no-latency", action="store_true", help="skip the timing section")
    args = ap.parse_args(argv)
    rows = load_rows(args.data)
    if not rows:
        raise SystemExit(f"no *.jsonl prompts under {args.data}")
    items = to_items(rows)
    truth = [t for _, t, _ in items]
    print(f"{len(items)} prompts from {args.data}")
    shipped = scores(truth, [classify(b).task for _, _, b in items])
    print_scores("shipped weights, full set (training score)", shipped)
    held_out = scores(*cross_validate(items, args.folds))
    print_scores(f"{args.folds}-fold cross-validation, weights refit per fold (held out)", held_out)
    print("\n== request shapes not in the dataset (accuracy, shipped weights)")
    for name, variant in shape_variants(rows).items():
        ok = sum(classify(b).task == t for _, t, b in variant)
        print(f"{name:<12} {ok}/{len(variant)} = {ok / max(len(variant), 1):.3f}")
    if not args.no_latency:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\n(Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load})")
        report_latency(items, rows)
    if args.fit:
        feats = [extract_features(b) or {} for _, _, b in items]
        print("\n== weights fitted on all items\n")
        print_weights(fit(feats, truth))


if __name__ == "__main__":
    main()
