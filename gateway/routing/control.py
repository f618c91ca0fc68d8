"""Per-request control of speculation: the ``X-Specgate-Speculation: off|on|auto`` header.

Pure code. The header's value is read into
:attr:`~gateway.classify.features.RequestFeatures.speculation`, and
:class:`~gateway.routing.policy.RoutingPolicy` honours it:

* ``auto`` (also: no header): the policy decides, as without the header;
* ``off``: plain backends only: every speculative backend is left out of the try list,
  failover targets included (none serving the model: the caller's 503, or 400 when none is
  configured);
* ``on``: speculative backends first, plain ones after them as failover targets. It
  overrides only the policy's speed judgements (rules, ``max_batch_for_speculation``,
  learnt speeds, acceptance demotion), never what keeps a request correct: a speculation
  method refusing the request's parameters, a known-engine-bug guard, the canaries'
  suspicion, the quarantine, seed pinning (among the speculative backends).

``on`` that the request's own parameters make impossible (every speculative backend serving
the model refuses a parameter, ``min_p``, ``logit_bias``..., or is guarded against its shape)
is refused (:func:`conflict`: the caller's 400), as a vLLM speculative server refuses
``min_p`` itself: sending it again cannot help. ``on`` that only live state defeats (every
speculative backend down, circuit open, at its cap, or suspect to a canary) is served by a
plain backend, with the reason in the answer's ``x-specgate-speculation``
(:func:`outcome`): the client asked for speed, and a 4xx for the servers' state, or a 503
while a plain backend could answer, would be wrong.
"""

from __future__ import annotations

from contracts.config import GatewayConfig
from gateway.classify.features import SPECULATION_AUTO, SPECULATION_OFF, SPECULATION_ON
from gateway.routing.policy import RouteDecision

#: The request header (and the answer's, with the effect), lower case as ASGI gives it.
HEADER = "x-specgate-speculation"
AUTO, ON, OFF = SPECULATION_AUTO, SPECULATION_ON, SPECULATION_OFF
VALUES = (AUTO, ON, OFF)


def read_value(value: str) -> str | None:
    """The control a header value names (``" OFF "`` is ``off``), None when unknown."""
    control = value.strip().lower()
    return control if control in VALUES else None


def conflict(config: GatewayConfig, decision: RouteDecision) -> tuple[str, str] | None:
    """Why the request's control cannot be honoured whatever the servers' state, as
    ``(message, param)`` for a 400 (None: it can). ``param``: the request parameter in the
    way (``min_p``, a guard's field, ``temperature`` for a guard on sampling) or the header.

    ``on``: every speculative backend serving the model refuses one of the request's
    parameters or had a known-engine-bug guard take it out of ``decision`` (applied
    already); ``off``: no plain backend serves the model, or the decision was pinned to a
    speculative one (the backend holding a Responses ``previous_response_id``)."""
    features = decision.features
    if features.speculation not in (ON, OFF):
        return None
    serving = {n: b for n, b in config.backends.items() if b.served_model == features.model}
    if features.speculation == OFF:
        if any(config.backends[b].spec.speculative for b in decision.backends):
            return decision.reasons[-1], HEADER  # pinned there (previous_response_id)
        if any(not b.spec.speculative for b in serving.values()):
            return None
        return f"no plain backend serves model '{features.model}'", HEADER
    guarded = dict(decision.guarded)
    why: list[str] = []
    params: list[str] = []
    for name, backend in serving.items():
        if not backend.spec.speculative:
            continue
        refused = features.spec_refused.get(backend.spec.method or "")
        guard = guarded.get(name)
        if refused:
            why.append(f"{name}: {backend.spec.method} speculation refuses {', '.join(refused)}")
            params.append(refused[0])
        elif guard is not None:
            match = config.guards[guard].match
            why.append(f"{name}: known engine bug '{guard}'")
            params.append(match.fields[0] if match.fields else "temperature")
        else:
            return None  # this one can serve it (or could, once up again)
    if not why:
        return f"no speculative backend serves model '{features.model}'", HEADER
    return "; ".join(why), params[0]


def outcome(config: GatewayConfig, decision: RouteDecision) -> tuple[str, str]:
    """The effect of the request's header, once the decision is final (guards applied,
    seed pinned): ``(text, result)``; ``text`` for the answer's ``x-specgate-speculation``
    and ``/routes/explain``, ``result`` for the metric: ``honoured``, ``plain`` (``on``
    served by a plain backend: no speculative one can take it now, the reasons in the text)
    or ``ignored`` (``routing.speculation_control: ignore``)."""
    features = decision.features
    asked = (features.speculation_header or AUTO)[:40]  # a client's text, bounded
    if config.routing.speculation_control == "ignore":
        return f"{asked} (ignored: routing.speculation_control is ignore)", "ignored"
    first = decision.backend
    if features.speculation != ON or first is None or config.backends[first].spec.speculative:
        return f"{features.speculation} (requested)", "honoured"
    spec = {n for n, b in config.backends.items() if b.spec.speculative}
    out = [f"{c.backend}: {c.why}" for c in decision.candidates if c.backend in spec and not c.kept]
    out += [f"{b}: known engine bug '{g}'" for b, g in decision.guarded if b in spec]
    reasons = ", ".join(dict.fromkeys(out)) or decision.reasons[-1]
    return f"on (requested; served plain, no speculative backend can take it now: {reasons})", (
        "plain"
    )


def served(config: GatewayConfig, effect: str, backend: str) -> str:
    """``effect`` (:func:`outcome`) as the answer's header, once ``backend`` answered: an
    ``on (requested)`` served by a plain backend after all (the speculative ones failed
    before answering, or refused the request's parameters: the gateway retried on plain)
    says so."""
    if effect != f"{ON} (requested)" or config.backends[backend].spec.speculative:
        return effect
    return f"{ON} (requested; served plain: the speculative backends failed or refused it)"
