"""Offline fit of the task classifier's weights (needs the ``bench`` extra: numpy, scipy).

    python -m bench.classify_fit [--data DIR] [--write]

Multinomial logistic regression over the four tasks on the named features of
``gateway.classify.signals`` and the words of the instruction window, fitted on the development
prompts in every request shape of ``bench.shapes``. L2 penalties (a light one on the named
features, a heavier one on the words, which are many and specific), samples weighted so that
each class and each item weigh the same whatever their count of shapes. The prior weights of
``gateway.classify.classifier.PRIOR`` are left out of the fit and added to its result: a
policy the development labels disagree with, which the fit must not learn to cancel. Solved
by L-BFGS (scipy); deterministic, so the fit is reproducible. ``--write`` regenerates
``gateway/classify/task_model.py``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy import optimize, sparse

from contracts.tasks import TASKS
from gateway.classify import task_model
from gateway.classify.classifier import PRIOR, TaskModel
from gateway.classify.signals import FEATURES

L2_FEATURES = 0.3  # per unit of item weight summed over the training set
L2_WORDS = 3.0
MIN_DF = 3  # a word is a feature if at least this many training items have it
MAX_WORDS = 4000
MIN_WORD_WEIGHT = 0.05  # smaller word weights are dropped: fewer lookups per decision
Sample = tuple[Mapping[str, float], frozenset[str]]
#: The module ``--write`` replaces: found from the module itself, so a move cannot strand it.
MODEL_PATH = Path(task_model.__file__)


def _word_ok(word: str) -> bool:
    return len(word) > 1 and not word.isdigit() and len(word) < 30


def vocabulary(samples: Sequence[Sample], groups: Sequence[str]) -> list[str]:
    """Words in at least MIN_DF distinct training items (by group), most frequent first."""
    seen: dict[str, set[str]] = {}
    for (_, toks), g in zip(samples, groups, strict=True):
        for w in toks:
            if _word_ok(w):
                seen.setdefault(w, set()).add(g)
    df = Counter({w: len(gs) for w, gs in seen.items() if len(gs) >= MIN_DF})
    return sorted(w for w, _ in df.most_common(MAX_WORDS))


def _design(samples: Sequence[Sample], words: Sequence[str]) -> sparse.csr_matrix:
    """Sparse design matrix: named features (but the PRIOR ones), then words."""
    col = {name: j for j, name in enumerate(FEATURES)}
    word_col = {w: len(FEATURES) + j for j, w in enumerate(words)}
    data: list[float] = []
    idx: list[int] = []
    ptr = [0]
    for feats, toks in samples:
        for name, value in feats.items():
            if value and name in col and name not in PRIOR:
                idx.append(col[name])
                data.append(value)
        for w in toks:
            j = word_col.get(w)
            if j is not None:
                idx.append(j)
                data.append(1.0)
        ptr.append(len(idx))
    shape = (len(samples), len(FEATURES) + len(words))
    return sparse.csr_matrix((data, idx, ptr), shape=shape)


def sample_weights(labels: Sequence[str], groups: Sequence[str]) -> np.ndarray:
    """Equal total weight per class, and per item within a class (whatever its shapes)."""
    per_group = Counter(groups)
    items = {c: len({g for g, t in zip(groups, labels, strict=True) if t == c}) for c in TASKS}
    n_items = len(per_group)
    return np.array(
        [
            n_items / (len(TASKS) * max(items[t], 1)) / per_group[g]
            for t, g in zip(labels, groups, strict=True)
        ]
    )


def fit(samples: Sequence[Sample], labels: Sequence[str], groups: Sequence[str]) -> TaskModel:
    """Fit a :class:`TaskModel` on (features, words) samples, their tasks and item ids."""
    words = vocabulary(samples, groups)
    x = _design(samples, words)
    y = np.zeros((len(labels), len(TASKS)))
    y[np.arange(len(labels)), [TASKS.index(t) for t in labels]] = 1.0
    sw = sample_weights(labels, groups)[:, None]
    d, k = x.shape[1], len(TASKS)
    penalty = np.full((d, 1), L2_WORDS)
    penalty[: len(FEATURES)] = L2_FEATURES
    xt = x.T.tocsr()

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[: d * k].reshape(d, k), theta[d * k :]
        z = x @ w + b
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        err = sw * (np.exp(logp) - y)
        value = -(sw * y * logp).sum() + 0.5 * (penalty * w * w).sum()
        grad = np.concatenate([(xt @ err + penalty * w).ravel(), err.sum(axis=0)])
        return float(value), grad

    res = optimize.minimize(
        loss, np.zeros(d * k + k), jac=True, method="L-BFGS-B", options={"maxiter": 2000}
    )
    w, b = res.x[: d * k].reshape(d, k), res.x[d * k :]
    b = b - b.mean()
    names = list(FEATURES)
    feature_weights = {
        n: tuple(round(float(v), 3) for v in w[j])
        for j, n in enumerate(names)
        if n not in PRIOR and np.abs(w[j]).max() >= 0.001
    }
    word_weights = {
        word: tuple(round(float(v), 3) for v in w[len(names) + j])
        for j, word in enumerate(words)
        if np.abs(w[len(names) + j]).max() >= MIN_WORD_WEIGHT
    }
    bias = tuple(round(float(v), 3) for v in b)
    return TaskModel(bias, feature_weights, word_weights)  # type: ignore[arg-type]


def render(model: TaskModel, source: str) -> str:
    """The text of ``gateway/classify/task_model.py`` for ``model``."""

    def row(values: Sequence[float]) -> str:
        return "(" + ", ".join(f"{v:.3f}" for v in values) + ")"

    lines = [
        '"""Fitted weights of the task classifier, columns in the order of',
        f"``contracts.tasks.TASKS`` {TASKS}.",
        "",
        "Generated by ``python -m bench.classify_fit --write``: do not edit.",
        f"Fitted on {source}.",
        "Named features: see ``gateway.classify.signals``; words: tokens of the instruction",
        'window (``gateway.classify.text.RequestText.instr``)."""',
        "",
        "from __future__ import annotations",
        "",
        "Weights = tuple[float, float, float, float]",
        "",
        f"BIAS: Weights = {row(model.bias)}",
        "FEATURE_WEIGHTS: dict[str, Weights] = {",
        *(f'    "{n}": {row(v)},' for n, v in model.features.items()),
        "}",
        "WORD_WEIGHTS: dict[str, Weights] = {",
        *(
            f"    {json.dumps(w, ensure_ascii=False)}: {row(v)},"
            for w, v in sorted(model.words.items())
        ),
        "}",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Fit on every development item in every shape; print or write the model."""
    from bench.classify_data import DEFAULT_DATA, load_rows, samples_of
    from bench.shapes import shaped

    ap = argparse.ArgumentParser(prog="python -m bench.classify_fit", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--write", action="store_true", help=f"write {MODEL_PATH.name}")
    args = ap.parse_args(argv)
    rows = load_rows(args.data)
    items = shaped(rows)
    model = fit(samples_of(items), [t for _, t, _, _ in items], [i for i, _, _, _ in items])
    text = render(model, f"{len(rows)} development prompts in {len(items) // len(rows)} shapes")
    if args.write:
        MODEL_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {MODEL_PATH} ({len(model.words)} words)")
    else:
        print(text)


if __name__ == "__main__":
    main()
