"""Seeds that reproduce: a seeded sampling request always goes to the same backend.

One vLLM server answers the same seeded request with the same tokens; two servers do not
(a speculative server spends its random numbers differently from a plain one, and replicas
batch differently). So the backend of a request that samples (vLLM's rule,
:func:`~gateway.classify.features.samples`) and carries a ``seed`` is a function of the
request and the config only: the first pool of its rule (its ``seeded_pool`` when set, then
its pool and each fallback pool, in order) that has a backend in the try list; within it,
the first such backend in the pool's order and its replicas (backends with the same
speculation settings: the same decode), and among those the backend with the highest
rendezvous hash of (request key, backend name) (Thaler and Ravishankar, "Using name-based
mappings to increase hit rates", 1998). Replicas share seeded traffic; different decodes
do not (measured on the GPU cost twin, 2026-12-01: hashing over a pool [eagle3, ngram]
sent 5 of 12 seeded requests to ngram at 0.5-0.6x plain's speed, docs/benchmarks.md
section 7). Learnt speeds, load, probes and random tie breaks do not enter; health does (a
backend that is down cannot answer), and so do the guards, ``max_inflight`` caps and
parameters a speculation method refuses (``min_p``, ...) that shaped the try list. So does
the request's ``X-Specgate-Speculation`` (part of the request): under ``on`` the pin is
among the try list's speculative backends (plain ones only when none is left), under
``off`` among its plain ones; when the rule's pools hold none of them, among all of them.
Greedy requests are not pinned: every backend returns the same tokens for them. Pure code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from contracts.config import GatewayConfig
from gateway.classify.features import SPECULATION_AUTO, SPECULATION_ON, samples
from gateway.routing.policy import DEFAULT_RULE, RouteDecision


def seeded(body: Mapping[str, Any], default_temperature: float) -> bool:
    """Whether ``body`` is a seeded request that samples (``seed`` present, not null and not
    vLLM's "no seed" -1)."""
    seed = body.get("seed")
    return seed is not None and seed != -1 and samples(body, default_temperature)


def _score(key: str, backend: str) -> bytes:
    return hashlib.blake2b(f"{key}\0{backend}".encode(), digest_size=8).digest()


def pin_seeded(
    config: GatewayConfig, decision: RouteDecision, body: Mapping[str, Any], key: str
) -> RouteDecision:
    """``decision`` with a deterministic first backend when ``body`` is seeded and samples
    (else unchanged). ``key``: the request's fingerprint (the same for the same request
    sent again, e.g. :func:`gateway.upstream.quarantine.fingerprint`). The rest of the try
    list keeps its order (failover targets)."""
    if not decision.backends or not seeded(body, config.defaults.temperature):
        return decision
    rule = next((r for r in config.rules if r.name == decision.rule), None)
    if rule is None or decision.rule == DEFAULT_RULE:
        pools = [config.defaults.pool]
    else:
        pools = list(dict.fromkeys([rule.seeded_pool or rule.pool, rule.pool, *rule.fallbacks]))
    refused = decision.features.spec_refused
    usable = [
        b
        for b in decision.backends
        if not refused.get(config.backends[b].spec.method or "")  # would refuse a parameter
    ]
    control = decision.features.speculation
    if control == SPECULATION_ON:
        usable = [b for b in usable if config.backends[b].spec.speculative] or usable
    for pool in pools:
        allowed = [b for b in config.pools.get(pool, []) if b in usable]
        if allowed:
            where = f"pool '{pool}'"
            break
    else:
        if control == SPECULATION_AUTO or not usable:
            return decision
        allowed, where = usable, f"speculation {control} (requested)"
    first = config.backends[allowed[0]].spec
    allowed = [b for b in allowed if config.backends[b].spec == first]  # its replicas
    chosen = max(allowed, key=lambda b: _score(key, b))
    order = (chosen, *(b for b in decision.backends if b != chosen))
    why = (
        f"seeded sampling request: pinned to {chosen} (rendezvous hash of the request over "
        f"{where}: {', '.join(allowed)}), so the seed reproduces"
    )
    return replace(decision, backends=order, reasons=(*decision.reasons, why))
