"""Offline fit of the task classifier's weights (stdlib only).

Multinomial logistic regression with ``chat`` as the reference class (its logit is 0), an L2
penalty on the weights (not the biases), solved by Newton's method with step halving. The
hand weights of ``gateway.routing.classifier.HAND_WEIGHTS`` enter as fixed offsets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gateway.routing.classifier import FEATURES, HAND_WEIGHTS, SCORED, TASKS, probabilities

FITTED = tuple(name for name in FEATURES if name not in HAND_WEIGHTS)
L2 = 1.0  # penalty strength on the summed log-loss; chosen by cross-validation (1..8 similar)
Model = tuple[tuple[float, float, float], dict[str, tuple[float, float, float]]]
_K = len(SCORED)
BALANCED = True  # weight samples by inverse class frequency (macro-F1 treats classes equally)


def _rows(feats: Sequence[Mapping[str, float]]) -> list[list[tuple[int, float]]]:
    """Sparse design rows: (column, value) with column 0 the bias."""
    col = {name: j + 1 for j, name in enumerate(FITTED)}
    return [[(0, 1.0), *((col[n], v) for n, v in f.items() if v and n in col)] for f in feats]


def _offsets(feats: Sequence[Mapping[str, float]]) -> list[list[float]]:
    """Fixed logit offsets contributed by hand-weighted features."""
    out = []
    for f in feats:
        off = [0.0] * _K
        for name, wt in HAND_WEIGHTS.items():
            for c in range(_K):
                off[c] += wt[c] * f.get(name, 0.0)
        out.append(off)
    return out


def _probs(theta: list[list[float]], row: list[tuple[int, float]], off: list[float]) -> list[float]:
    z = [off[c] + sum(theta[c][j] * v for j, v in row) for c in range(_K)]
    top = max(0.0, *z)
    e = [math.exp(v - top) for v in z]
    rest = math.exp(-top)
    total = rest + sum(e)
    return [v / total for v in e] + [rest / total]  # scored classes, then chat


def _loss(theta, rows, offs, ys, sw) -> float:  # type: ignore[no-untyped-def]
    nll = -sum(
        s * math.log(max(_probs(theta, r, o)[y], 1e-300))
        for r, o, y, s in zip(rows, offs, ys, sw, strict=True)
    )
    return nll + L2 / 2 * sum(w * w for th in theta for w in th[1:])


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Solve a x = b by Gaussian elimination with partial pivoting (a is positive definite)."""
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


def fit(feats: Sequence[Mapping[str, float]], labels: Sequence[str], iters: int = 25) -> Model:
    """Fit BIAS and WEIGHTS on feature dicts and their task labels (strings in TASKS)."""
    rows, offs = _rows(feats), _offsets(feats)
    order = [*SCORED, "chat"]
    ys = [order.index(t) for t in labels if t in TASKS]
    counts = [ys.count(c) for c in range(len(order))]
    sw = [len(ys) / (len(order) * counts[y]) if BALANCED else 1.0 for y in ys]
    d = len(FITTED) + 1
    theta = [[0.0] * d for _ in range(_K)]
    loss = _loss(theta, rows, offs, ys, sw)
    for _ in range(iters):
        grad = [[L2 * w if j else 0.0 for j, w in enumerate(th)] for th in theta]
        hess = [[0.0] * (_K * d) for _ in range(_K * d)]
        for i in range(_K * d):
            hess[i][i] = L2 if i % d else 1e-6
        for row, off, y, wy in zip(rows, offs, ys, sw, strict=True):
            p = _probs(theta, row, off)
            for c in range(_K):
                err = wy * (p[c] - (1.0 if y == c else 0.0))
                for j, v in row:
                    grad[c][j] += err * v
                for c2 in range(_K):
                    s = wy * p[c] * ((1.0 if c == c2 else 0.0) - p[c2])
                    for j, v in row:
                        hrow = hess[c * d + j]
                        for k, u in row:
                            hrow[c2 * d + k] += s * v * u
        step = _solve(hess, [g for th in grad for g in th])
        scale = 1.0
        while scale > 1e-4:
            trial = [[w - scale * step[c * d + j] for j, w in enumerate(theta[c])] for c in range(_K)]
            new = _loss(trial, rows, offs, ys, sw)
            if new <= loss:
                break
            scale /= 2
        theta, done = trial, loss - new < 1e-7
        loss = new
        if done:
            break
    bias = (theta[0][0], theta[1][0], theta[2][0])
    return bias, {name: (theta[0][j + 1], theta[1][j + 1], theta[2][j + 1]) for j, name in enumerate(FITTED)}


def predict(feats: Mapping[str, float], model: Model) -> str:
    """The most probable task of a feature dict under ``model``."""
    probs = probabilities(feats, model[1], model[0])
    return max(TASKS, key=probs.__getitem__)
