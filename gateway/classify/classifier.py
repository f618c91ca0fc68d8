"""Fast task classifier: code, rag, chat or creative, from an OpenAI request body.

A transparent linear model, multinomial logistic regression over two kinds of input:

- the named features of ``gateway.classify.signals`` (code syntax and stubs, passage markers
  and markup, grounding phrases, tool results, creative-writing verbs in about 30 languages,
  ...), each a small float;
- the words of the instruction window (head and tail of the final user message, heads of the
  system prompt and recent user turns) and the first three words of the final message, each
  present or absent.

The weights (``gateway.classify.task_model``) are fitted offline by
``python -m bench.classify_fit --write`` on the development prompts rebuilt in the request
shapes clients send (``bench.shapes``: context in the system message, XML document blocks,
completion templates, earlier turns, content parts, tool-calling conversations), so no shape
and no single RAG template carries the decision; ``python -m bench.classify`` scores it
leave-one-shape-out and by cross-validation. A few prior weights (``PRIOR``) are set by hand,
each with its reason, where the development labels cannot teach the right weight.

``tools`` in a request say nothing about the task: a weather or calendar tool call is chat.

Second stage (optional, ``gateway.classify.embedding``): when the fast stage's top probability
is under a threshold (0.8) and its top task is not one a policy fixes (:func:`asks_second`:
about 6% of the development requests with the shipped weights, 12-13% in held-out folds) and
the instruction window is English, line by line, the pooled all-MiniLM-L6-v2 word-piece
vectors of that window give a second opinion, multiplied in. The gateway loads it at startup
when ``specgate models prepare`` has built its files (``gateway.classify.embedding_stage``)
and runs without it otherwise.

Cost: at most ~4,000 characters read whatever the body's size (see ``gateway.classify.text``),
a few dozen C-level scans and set lookups, two small weighted sums: tens of microseconds per
decision (``python -m bench.classify`` measures it). No I/O, no mutable state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from contracts.tasks import TASKS
from gateway.classify import task_model
from gateway.classify.embedding import SecondStage, combine
from gateway.classify.signals import read_signals
from gateway.classify.text import RequestText, read_request

Weights = tuple[float, float, float, float]

# Hand-set weights (columns as TASKS), left out of the fit and added to the fitted model.
PRIOR: dict[str, Weights] = {
    # The development chat class holds ~20 programming requests (AlpacaEval), the code class
    # ~100 programming questions (Arena-Hard), mostly long: fitted, language names and "write
    # a function" learn a blurred weight, and a short programming question ("how do I undo a
    # commit in git?") reads as chat. For routing, a request that names a language, library or
    # tool, or asks for a program, is code (bench.classify shows the cost on the dev labels).
    "code_langs": (3.5, 0.0, 0.0, -0.5),
    "code_ask": (1.5, 0.0, 0.0, -0.5),
    # Grounding phrases ("use the following context", "according to the passage", 根据以下...)
    # in any language: the development RAG is English only, so a fitted weight (about 0.5)
    # leaves non-English RAG to the other cues, which it has never seen in those languages.
    "rag_phrases": (-0.5, 1.5, -0.3, 0.0),
}


# The second stage re-ranks the tasks these do not fix (see gateway.classify.embedding.combine):
# RAG always (the instruction window it reads leaves the documents out); code when a PRIOR
# code feature fired, so that the second stage, fitted on the development labels, cannot undo
# the routing policy above ("how do I undo a commit in git?" is code).
FIXED_ALWAYS = frozenset({"rag"})
FIXED_BY: dict[str, str] = {"code_langs": "code", "code_ask": "code"}


def fixed_tasks(feats: Mapping[str, float]) -> frozenset[str]:
    """The tasks the second stage may not move for a request with features ``feats``:
    FIXED_ALWAYS, plus code when a FIXED_BY feature fired."""
    return FIXED_ALWAYS.union(t for f, t in FIXED_BY.items() if feats.get(f))


def asks_second(probs: Mapping[str, float], fixed: frozenset[str], threshold: float) -> bool:
    """Whether the second stage is asked: the fast stage's top probability is under
    ``threshold`` and its top task is not in ``fixed`` (a fixed task could lose to the second
    stage there but never gain, so an unsure RAG or code-policy decision stays as it is)."""
    top = max(probs, key=probs.__getitem__)
    return probs[top] < threshold and top not in fixed


class TaskModel(NamedTuple):
    """Weights of the linear model: ``bias`` per task, ``features`` named feature -> weight per
    task, ``words`` instruction-window word -> weight per task (columns in TASKS order)."""

    bias: Weights
    features: Mapping[str, Weights]
    words: Mapping[str, Weights]


def with_prior(model: TaskModel) -> TaskModel:
    """``model`` with the PRIOR weights in its feature table (one lookup per feature)."""
    return model._replace(features={**model.features, **PRIOR})


SHIPPED = with_prior(
    TaskModel(task_model.BIAS, task_model.FEATURE_WEIGHTS, task_model.WORD_WEIGHTS)
)


@dataclass(frozen=True, slots=True)
class TaskGuess:
    """A task decision: ``task`` in TASKS, ``confidence`` in 0..1 (the model's probability
    of that task), ``features`` the non-zero features and the four probabilities (``p_*``;
    with ``e_*`` the second stage's, when it was asked); ``stage``: "fast", or "embedding"
    when the second stage took part."""

    task: str
    confidence: float
    features: dict[str, float]
    stage: str = "fast"


def probabilities(
    feats: Mapping[str, float], words: frozenset[str] = frozenset(), model: TaskModel = SHIPPED
) -> dict[str, float]:
    """Softmax probability of each task in TASKS given named features and words (``model``:
    its feature table includes the PRIOR weights, see :func:`with_prior`)."""
    code, rag, chat, creative = model.bias
    table = model.features
    for name, value in feats.items():
        if value:
            wt = table.get(name)
            if wt is not None:
                code += wt[0] * value
                rag += wt[1] * value
                chat += wt[2] * value
                creative += wt[3] * value
    vocab = model.words
    hits = [vocab[word] for word in vocab.keys() & words]
    if hits:  # column sums in C: ~100 hits cost a few microseconds
        col = [sum(c) for c in zip(*hits, strict=True)]
        code, rag, chat, creative = code + col[0], rag + col[1], chat + col[2], creative + col[3]
    top = max(code, rag, chat, creative)
    e = (math.exp(code - top), math.exp(rag - top), math.exp(chat - top),
         math.exp(creative - top))  # fmt: skip
    total = e[0] + e[1] + e[2] + e[3]
    return {"code": e[0] / total, "rag": e[1] / total, "chat": e[2] / total,
            "creative": e[3] / total}  # fmt: skip


def classify(
    body: Mapping[str, Any], *, default_task: str = "chat", second: SecondStage | None = None
) -> TaskGuess:
    """Guess the task of an OpenAI request body.

    ``body``: the parsed JSON of a completions request (``prompt``: string, list of strings,
    token ids) or a chat request (``messages`` with string or part-list contents). Malformed
    or unreadable bodies (e.g. token-id prompts) give ``default_task`` with confidence 0.25.
    ``second``: the embedding stage, asked when the fast stage is unsure (None: fast only).
    Never raises.
    """
    rt = read_request(body) if isinstance(body, Mapping) else None
    return classify_text(rt, default_task=default_task, second=second)


def classify_text(
    rt: RequestText | None, *, default_task: str = "chat", second: SecondStage | None = None
) -> TaskGuess:
    """:func:`classify` on text already read from a body (``rt``: ``read_request(body)``,
    None when it had no readable text), so one read serves the classifier and the prompt
    statistics on the hot path."""
    if default_task not in TASKS:
        default_task = "chat"
    if rt is None:
        return TaskGuess(default_task, 0.25, {})
    feats, words = read_signals(rt)
    probs = probabilities(feats, words)
    shown = {name: value for name, value in feats.items() if value}
    for t, p in probs.items():
        shown[f"p_{t}"] = round(p, 3)
    stage = "fast"
    if second is not None and max(probs.values()) < second.threshold:  # else: the fast path
        fixed = fixed_tasks(feats)
        other = second.probabilities(rt) if asks_second(probs, fixed, second.threshold) else None
        if other is not None:
            for t, p in other.items():
                shown[f"e_{t}"] = round(p, 3)
            probs, stage = combine(probs, other, fixed), "embedding"
    task = max(probs, key=probs.__getitem__)
    return TaskGuess(task, round(probs[task], 4), shown, stage)
