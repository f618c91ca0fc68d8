"""A routing decision as the JSON that ``/routes/explain`` and ``specgate explain`` print."""

from __future__ import annotations

from typing import Any

from gateway.routing.policy import RouteDecision


def decision_json(decision: RouteDecision) -> dict[str, Any]:
    """``{"task", "task_confidence", "task_source", "task_features", "temperature",
    "temperature_given", "rule", "pool", "backend", "backends", "candidates": [{"backend",
    "pool", "kept", "why"}], "reasons": [...], "guarded": [{"backend", "guard"}],
    "adaptive", "last_resort", "speculation": {"header", "control", "effect"}}``
    (``speculation``: the request's ``X-Specgate-Speculation`` as sent, the control routing
    honoured, and its effect as the answer's header says it, all None/``auto`` without one;
    ``guarded``: backends a known-engine-bug guard took out);
    ``backend`` is None when nothing can serve; ``last_resort`` says why backends outside
    the rule's pools serve (else None); ``adaptive`` is None under the static policy, else
    the learnt estimates behind the choice (see
    :meth:`~gateway.routing.adaptive_choice.AdaptiveChoice.to_json`; its ``chosen`` is the
    decision's final backend, and ``policy_choice`` the policy's own pick when a guard, seed
    pinning or the speculation control moved the request elsewhere)."""
    f = decision.features
    return {
        "task": f.task,
        "task_confidence": round(f.task_confidence, 4),
        "task_source": f.task_source,
        "task_features": dict(f.task_features),
        "temperature": f.temperature,
        "temperature_given": f.temperature_given,
        "model": f.model,
        "rule": decision.rule,
        "pool": decision.pool,
        "backend": decision.backend,
        "backends": list(decision.backends),
        "candidates": [
            {"backend": c.backend, "pool": c.pool, "kept": c.kept, "why": c.why}
            for c in decision.candidates
        ],
        "reasons": list(decision.reasons),
        "guarded": [{"backend": b, "guard": g} for b, g in decision.guarded],
        "adaptive": _adaptive(decision),
        "last_resort": decision.last_resort,
        "speculation": {
            "header": f.speculation_header,
            "control": f.speculation,
            "effect": decision.speculation,
        },
    }


def _adaptive(decision: RouteDecision) -> dict[str, Any] | None:
    """The ``adaptive`` block naming the final choice (:func:`decision_json`)."""
    if decision.adaptive is None:
        return None
    out = decision.adaptive.to_json()
    if decision.backend != out["chosen"]:
        out["policy_choice"], out["chosen"] = out["chosen"], decision.backend
    return out
