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


def read_temperature(body: Mapping[str, Any], default: float) -> tuple[float, bool]:
    """The request's temperature and whether it was given.

    ``None``/absent gives ``(default, False)``. Callers validate the type beforehand.
    """
    value = body.get("temperature")
    if value is None:
        return default, False
    return float(value), True


def header_task(value: str | None) -> str | None:
    """The task named by an ``X-Task-Type`` header, or None when absent or not a known task."""
    if value is None:
        return None
    task = value.strip().lower()
    return task if task in TASKS else None
