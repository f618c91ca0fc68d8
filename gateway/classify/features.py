"""Request features the routing policy decides on, read from a parsed request body."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.tasks import TASKS


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What routing knows about one request.

    ``temperature`` is the request's own value or the configured default
    (``temperature_given`` says which); ``task`` comes from the ``X-Task-Type`` header
    (``task_source == "header"``, confidence 1.0) or the classifier, whose deciding
    features are in ``task_features``. ``spec_refused`` maps a speculation method to the
    request's parameters its backends refuse (see :mod:`gateway.speculation.spec_params`).
    ``speculation``: the per-request control routing honours (:data:`SPECULATION_AUTO`,
    :data:`SPECULATION_ON` or :data:`SPECULATION_OFF`, see :mod:`gateway.routing.control`);
    ``speculation_header``: the client's ``X-Specgate-Speculation`` value as read (None: no
    header), kept for the answer's header.
    """

    model: str
    temperature: float
    temperature_given: bool
    task: str
    task_confidence: float
    task_source: str
    stream: bool = False
    task_features: Mapping[str, float] = field(default_factory=dict)
    spec_refused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    speculation: str = "auto"
    speculation_header: str | None = None


#: The values of ``X-Specgate-Speculation`` (:mod:`gateway.routing.control`).
SPECULATION_AUTO, SPECULATION_ON, SPECULATION_OFF = "auto", "on", "off"


def read_temperature(body: Mapping[str, Any], default: float) -> tuple[float, bool]:
    """The request's temperature and whether it was given.

    ``None``/absent gives ``(default, False)``. Callers validate the type beforehand.
    """
    value = body.get("temperature")
    if value is None:
        return default, False
    return float(value), True


#: vLLM's greedy threshold (``vllm/sampling_params.py``, ``_SAMPLING_EPS``): a temperature
#: below it decodes greedily, at or above it samples.
SAMPLING_EPS = 1e-5


def _lax_number(value: Any) -> float | None:
    """``value`` read as a number the way pydantic's lax mode reads it (``"0.2"`` is 0.2);
    None when absent or unreadable."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def samples(body: Mapping[str, Any], default_temperature: float) -> bool:
    """Whether vLLM samples for ``body`` (any generating endpoint's shape: chat, completions,
    Responses, Anthropic messages, the relayed ones), as ``SamplingParams`` decides: the
    temperature (absent, null or unreadable: ``default_temperature``, the config's
    ``defaults.temperature``, OpenAI's 1.0) at or above :data:`SAMPLING_EPS`, or more than
    one sequence asked for (``n`` or ``best_of`` > 1; vLLM refuses ``n`` > 1 when greedy).
    ``top_p``, ``top_k``, ``min_p`` do not make a greedy request sample (vLLM resets them
    at temperature 0)."""
    temperature = _lax_number(body.get("temperature"))
    if (default_temperature if temperature is None else temperature) >= SAMPLING_EPS:
        return True
    return any((_lax_number(body.get(name)) or 1) > 1 for name in ("n", "best_of"))


def header_task(value: str | None) -> str | None:
    """The task named by an ``X-Task-Type`` header, or None when absent or not a known task."""
    if value is None:
        return None
    task = value.strip().lower()
    return task if task in TASKS else None
