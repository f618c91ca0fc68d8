"""Offline fit of the task classifier's code and creative weights (stdlib only).

Multinomial logistic regression over the four tasks where only the code and creative logits
are fitted: chat is the reference (logit 0), the rag logit and the hand weights of
``gateway.routing.classifier`` enter as fixed offsets. L2 penalty on the weights (not the
biases), samples weighted by inverse class frequency (macro-F1 treats classes equally),
solved by Newton's method with step halving.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gateway.routing.classifier import (
    FEATURES,
    HAND_WEIGHTS,
    RAG_BIAS,
    RAG_WEIGHTS,
    TASKS,
    probabilities,
)

FITTED = tuple(name for name in FEATURES if name not in HAND_WEIGHTS)
L2 = 1.0  # penalty on the summed weighted log-loss; 0.25..4 give similar held-out scores
BALANCED = True
ORDER = ("code", "creative", "rag", "chat")  # fitted classes first
Model = tuple[tuple[float, float], dict[str, tuple[float, float]]]
Row = list[tuple[int, float]]


def _design(feats: Sequence[Mapping[str, float]]) -> tuple[list[Row], list[list[float]]]:
    """Sparse rows (column 0 is the bias) and fixed logits (code, creative, rag) per sample."""
    col = {name: j + 1 for j, name in enumerate(FITTED)}
    rows: list[Row] = []
    offsets: list[list[float]] = []
    for f in feats:
        rows.append([(0, 1.0), *((col[n], v) for n, v in f.items() if v and n in col)])
        off = [0.0, 0.0, RAG_BIAS]
        for name, value in f.items():
            hand = HAND_WEIGHTS.get(name)
            if hand and value:
                off[0] += hand[0] * value
                off[1] += hand[1] * value
            off[2] += RAG_WEIGHTS.get(name, 0.0) * value
        offsets.append(off)
    return rows, offsets


def _probs(theta: list[list[float]], row: Row, off: list[float]) -> list[float]:
    """Probabilities in ORDER."""
    z = [off[c] + sum(theta[c][j] * v for j, v in row) for c in range(2)] + [off[2], 0.0]
    top = max(z)
    e = [math.exp(v - top) for v in z]
    total = sum(e)
    return [v / total for v in e]


def _loss(theta: list[list[float]], data: list[tuple[Row, list[float], int, float]]) -> float:
    nll = -sum(s * math.log(max(_probs(theta, r, o)[y], 1e-300)) for r, o, y, s in data)
    return nll + L2 / 2 * sum(w * w for th in theta for w in th[1:])


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Solve a x = b by Gaussian elimination with partial pivoting (a positive definite)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for i in range(n):
        p = max(range(i, n), key=lambda r: abs(m[r][i]))
        m[i], m[p] = m[p], m[i]
        for r in range(i + 1, n):
            f = m[r][i] / m[i][i]
            if f:
                for c in range(i, n + 1):
                    m[r][c] -= f * m[i][c]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (m[i][n] - sum(m[i][c] * x[c] for c in range(i + 1, n))) / m[i][i]
    return x


def _newton_step(
    theta: list[list[float]], data: list[tuple[Row, list[float], int, float]]
) -> list[float]:
    """The Newton direction for the flattened (code, creative) parameters."""
    d = len(theta[0])
    grad = [L2 * w if j else 0.0 for th in theta for j, w in enumerate(th)]
    hess = [[0.0] * (2 * d) for _ in range(2 * d)]
    for i in range(2 * d):
        hess[i][i] = L2 if i % d else 1e-6
    for row, off, y, weight in data:
        p = _probs(theta, row, off)
        for c in range(2):
            err = weight * (p[c] - (1.0 if y == c else 0.0))
            for j, v in row:
                grad[c * d + j] += err * v
            for c2 in range(2):
                s = weight * p[c] * ((1.0 if c == c2 else 0.0) - p[c2])
                for j, v in row:
                    hrow = hess[c * d + j]
                    for k, u in row:
                        hrow[c2 * d + k] += s * v * u
    return _solve(hess, grad)


def fit(feats: Sequence[Mapping[str, float]], labels: Sequence[str], iters: int = 30) -> Model:
    """Fit BIAS and WEIGHTS on feature dicts and their task labels (strings in TASKS)."""
    rows, offsets = _design(feats)
    ys = [ORDER.index(t) for t in labels]
    counts = [max(ys.count(c), 1) for c in range(len(ORDER))]
    data = [
        (r, o, y, len(ys) / (len(ORDER) * counts[y]) if BALANCED else 1.0)
        for r, o, y in zip(rows, offsets, ys, strict=True)
    ]
    d = len(FITTED) + 1
    theta = [[0.0] * d for _ in range(2)]
    loss = _loss(theta, data)
    for _ in range(iters):
        step = _newton_step(theta, data)
        scale = 1.0
        while scale > 1e-4:
            trial = [
                [w - scale * step[c * d + j] for j, w in enumerate(theta[c])] for c in range(2)
            ]
            new = _loss(trial, data)
            if new <= loss:
                break
            scale /= 2
        else:
            break
        theta, improved, loss = trial, loss - new, new
        if improved < 1e-7:
            break
    weights = {name: (theta[0][j + 1], theta[1][j + 1]) for j, name in enumerate(FITTED)}
    return (theta[0][0], theta[1][0]), weights


def predict(feats: Mapping[str, float], model: Model) -> str:
    """The most probable task of a feature dict under ``model``."""
    probs = probabilities(feats, model[1], model[0])
    return max(TASKS, key=probs.__getitem__)
