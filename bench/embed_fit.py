"""Offline fit of the task classifier's second-stage head (needs the ``bench`` extra).

    python -m bench.embed_fit [--data DIR] [--embedding DIR] [--write]

Multinomial logistic regression from the pooled MiniLM word-piece vector of a request's
instruction window (``gateway.classify.embedding``, 384 dimensions, unit length) to the four
tasks, fitted on the development prompts in every request shape of ``bench.shapes`` with the
fast stage's sample weights (each class and each item weigh the same) and an L2 penalty.
Deterministic (L-BFGS from zeros). ``--write`` regenerates ``gateway/classify/embedding_head.py``.
The vectors come from ``specgate models prepare`` (``--embedding``, default the cache's
``models/minilm-token-vectors``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy import optimize

from backends.embedding_files import embedding_folder
from bench.classify_data import Shaped
from bench.classify_fit import sample_weights
from contracts.paths import CachePaths
from contracts.tasks import TASKS
from gateway.classify import embedding_head
from gateway.classify.embedding import TokenVectors
from gateway.classify.embedding_stage import load_stages
from gateway.classify.text import read_request

L2 = 1.0  # per unit of mean sample weight
#: Fast-stage top probability under which the second stage is consulted: 0.8 sent 15% of the
#: shaped development requests to it and gave the best held-out macro-F1 of 0.6/0.8/0.9/0.95
#: in the trial that chose this design (leave-one-shape-out, heads fitted on training folds).
THRESHOLD = 0.8
#: The module ``--write`` replaces: found from the module itself, so a move cannot strand it.
HEAD_PATH = Path(embedding_head.__file__)
Head = tuple[NDArray[np.float64], NDArray[np.float64]]  # weights (384, 4), bias (4,)


def default_folder() -> Path:
    """The second-stage files of ``specgate models prepare`` in the default cache."""
    return embedding_folder(CachePaths.default())


def load_vectors(folder: Path | None) -> TokenVectors | None:
    """The tokenizer and word-piece matrix in ``folder`` (default: the cache's), or None."""
    stages = load_stages(folder or default_folder())
    return stages.second.vectors if stages.second is not None else None


def embed_items(items: Sequence[Shaped], vectors: TokenVectors) -> NDArray[np.float32]:
    """The pooled vector of every shaped item's instruction window (zeros when it has none),
    shape (len(items), 384)."""
    out = np.zeros((len(items), vectors.vectors.shape[1]), dtype=np.float32)
    for i, (_, _, _, body) in enumerate(items):
        rt = read_request(body)
        emb = vectors.embed_request(rt) if rt is not None else None
        if emb is not None:
            out[i] = emb
    return out


def fit_head(x: NDArray[np.float32], labels: Sequence[str], groups: Sequence[str]) -> Head:
    """Fit the head on vectors ``x`` (n, d), their tasks and item ids; rows of zeros (items
    the second stage never reads: another language, no known word piece) are left out."""
    keep = np.flatnonzero(x.any(axis=1))
    x, labels, groups = x[keep], [labels[i] for i in keep], [groups[i] for i in keep]
    n, d = x.shape
    k = len(TASKS)
    y = np.zeros((n, k))
    y[np.arange(n), [TASKS.index(t) for t in labels]] = 1.0
    sw = sample_weights(labels, groups)
    sw = (sw / sw.mean())[:, None]
    xd = x.astype(np.float64)

    def loss(theta: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        w, b = theta[: d * k].reshape(d, k), theta[d * k :]
        z = xd @ w + b
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        err = sw * (np.exp(logp) - y)
        value = -(sw * y * logp).sum() + 0.5 * L2 * (w * w).sum()
        grad = np.concatenate([(xd.T @ err + L2 * w).ravel(), err.sum(axis=0)])
        return float(value), grad

    res = optimize.minimize(
        loss, np.zeros(d * k + k), jac=True, method="L-BFGS-B", options={"maxiter": 3000}
    )
    w, b = res.x[: d * k].reshape(d, k), res.x[d * k :]
    return w, b - b.mean()


def head_probabilities(x: NDArray[np.float32], head: Head) -> NDArray[np.float64]:
    """Softmax probabilities (n, 4) of vectors ``x`` under ``head``."""
    z = x.astype(np.float64) @ head[0] + head[1]
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def render(head: Head, source: str) -> str:
    """The text of ``gateway/classify/embedding_head.py`` for ``head``."""

    def row(values: Sequence[float]) -> str:
        return "(" + ", ".join(f"{v:.4f}" for v in values) + ")"

    return "\n".join([
        '"""Fitted head of the task classifier\'s second stage (``gateway.classify.embedding``):',
        "384 x 4 weights and 4 biases, columns in the order of ``contracts.tasks.TASKS``",
        f"{TASKS}.",
        "",
        "Generated by ``python -m bench.embed_fit --write``: do not edit.",
        f'Fitted on {source}."""',
        "",
        "from __future__ import annotations",
        "",
        "Row = tuple[float, float, float, float]",
        "",
        f"THRESHOLD = {THRESHOLD}  # fast-stage top probability under which the head is asked",
        f"BIAS: Row = {row(head[1])}",
        "WEIGHTS: tuple[Row, ...] = (",
        *(f"    {row(r)}," for r in head[0]),
        ")",
        "",
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Fit on every development item in every shape; print a summary or write the head."""
    from bench.classify_data import DEFAULT_DATA, load_rows
    from bench.shapes import shaped

    ap = argparse.ArgumentParser(prog="python -m bench.embed_fit", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--embedding", type=Path, default=None, help="prepared files folder")
    ap.add_argument("--write", action="store_true", help=f"write {HEAD_PATH.name}")
    args = ap.parse_args(argv)
    vectors = load_vectors(args.embedding)
    if vectors is None:
        raise SystemExit("second-stage files missing: run `specgate models prepare` first")
    rows = load_rows(args.data)
    items = shaped(rows)
    x = embed_items(items, vectors)
    head = fit_head(x, [t for _, t, _, _ in items], [i for i, _, _, _ in items])
    read = int(x.any(axis=1).sum())
    text = render(head, f"{len(rows)} development prompts in {len(items) // len(rows)} shapes:\n"
                  f"{read} of {len(items)} requests read (the others: in another language\n"
                  "than English, or without a known word piece)")  # fmt: skip
    if args.write:
        HEAD_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {HEAD_PATH}")
    else:
        print(text[:2000])


if __name__ == "__main__":
    main()
