"""Admin endpoints: what the gateway routes to and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request

from contracts.config import ConfigError, GatewayConfig
from gateway.api.deps import GatewayDep, RuntimeDep, SettingsDep
from gateway.api.openai import read_body
from gateway.classify.protocol import kind_of
from gateway.errors import bad_request, config_invalid
from gateway.pipeline import parse_json, refuse_quarantined
from gateway.runtime import runtime_of
from gateway.service import Gateway
from gateway.speculation.advisor import advise_window
from gateway.upstream.deaths import DeathWatch
from gateway.upstream.view import BackendView

router = APIRouter(tags=["admin"])


@router.get("/routes")
async def routes(runtime: RuntimeDep, gateway: GatewayDep) -> dict[str, Any]:
    """Every backend (URL, model, speculation, health, in-flight, canary suspicion, deaths
    and the last one, its process supervision under ``specgate up``), the
    ordered rules, the pools, decision counts per rule, task and serving backend since start,
    the correctness canary's last results (None when it is off), the distribution canary's
    budget, cost, verdicts and evidence per backend and band (None when it is off), and
    what adaptive routing learnt (estimates per task, bucket and backend; the newest
    per-request records), and the quarantine's counts and the task classifier's stages
    (is its embedding stage on?)."""
    config, watch = gateway.config, runtime.deaths
    processes = {} if runtime.processes is None else runtime.processes()
    death_view = watch.to_json()
    backends = [
        _backend_json(view, config, death_view, processes.get(view.name))
        for view in gateway.backends()
    ]
    canary, sample_canary = runtime.canary, runtime.sample_canary
    return {
        "backends": backends,
        **_config_json(config),
        "classifier": gateway.classifier.view(),
        "decisions": _decisions_json(gateway),
        "guards": {name: g.model_dump() for name, g in config.guards.items()},
        "canary": None if canary is None else canary.to_json(),
        "sample_canary": None if sample_canary is None else sample_canary.to_json(),
        "quarantine": quarantine_summary(watch),
        "state": runtime.state.to_json(),
        "adaptive": gateway.feedback.to_json() | {"break_even": gateway.break_even()},
    }


def _backend_json(
    view: BackendView, config: GatewayConfig, death_view: dict[str, Any], process: Any
) -> dict[str, Any]:
    """One backend as ``GET /routes`` shows it (``death_view``: the death watch's JSON,
    ``process``: its supervision under ``specgate up``, None otherwise)."""
    name, backend = view.name, view.config
    return {
        "name": name,
        "url": backend.base_url,
        "model": backend.served_model,
        "local": backend.local,
        "speculation": backend.spec.model_dump(exclude_none=True),
        "healthy": {"up": True, "down": False, "unknown": None}[view.health],
        "health": view.health,
        "last_error": view.last_error,
        "last_scrape": view.last_scrape,
        "inflight": view.inflight,
        "load": {
            "running": view.running,
            "waiting": view.waiting,
            "other_clients": view.other_clients,
            "request_duration_s": view.request_duration_s,
            "kv_cache_usage": view.kv_cache_usage,
            "max_batch_for_speculation": backend.max_batch_for_speculation,
        },
    } | _verdicts_json(view, config, death_view, process)


def _verdicts_json(
    view: BackendView, config: GatewayConfig, death_view: dict[str, Any], process: Any
) -> dict[str, Any]:
    """The rest of :func:`_backend_json`: acceptance, breaker, demotion, canaries, advice,
    guards, deaths, process."""
    backend, acceptance = view.config, view.acceptance
    tip = advise_window(backend.spec, view.window)  # the tuning advisor's (None for plain)
    window = {"window_s": config.routing.acceptance_window_s}
    return {
        "acceptance": None if acceptance is None else asdict(acceptance) | window,
        "min_acceptance_rate": backend.acceptance_floor(config.routing.min_acceptance_rate),
        "circuit": {
            "state": view.circuit,
            "consecutive_failures": view.breaker.failures,
            "opened": view.breaker.opened_count,
        },
        "demoted": view.demoted,
        "demotions": view.demotions,
        "suspect": view.suspect,
        "sample_suspect": view.sample_suspect,
        "requests": view.requests,
        "advice": None if tip is None else tip.to_json(),
        "guards": backend.guards,
        "deaths": death_view["deaths"].get(view.name, 0),
        "last_death": death_view["last"].get(view.name),
        "process": process,
    }


def _config_json(config: GatewayConfig) -> dict[str, Any]:
    """The pools, the ordered rules (the default one last), defaults and routing settings."""
    rules = [rule.model_dump(exclude_none=True) for rule in config.rules]
    rules.append({"name": "default", "match": {}, "pool": config.defaults.pool, "fallbacks": []})
    return {
        "pools": config.pools,
        "rules": rules,
        "defaults": config.defaults.model_dump(),
        "routing": config.routing.model_dump(),
    }


def _decisions_json(gateway: Gateway) -> dict[str, Any]:
    """The decision counts since start, as ``GET /routes`` shows them."""
    stats = gateway.stats
    return {
        "by_rule": dict(stats.by_rule),
        "by_task": dict(stats.by_task),
        "by_backend": dict(stats.by_backend),
        "failovers": stats.failovers,
        "rejected": stats.rejected,
        "last_resort": stats.last_resort,
        "guarded": dict(stats.guarded),
        "speculation_control": by_value(stats.speculation),
        "speculation_refuses": gateway.spec_params.snapshot(),
        # bursts of 2+ requests met after a quiet spell, routed as one (gateway.arrivals)
        "cohorts": {k: gateway.arrivals.cohorts[k] for k in ("formed", "requests")},
    }


def by_value(counts: Mapping[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    """``{(value, result): n}`` as ``{value: {result: n}}`` (the per-request speculation
    control's counts: ``{"on": {"honoured": 3, "plain": 1}}``)."""
    out: dict[str, dict[str, int]] = {}
    for (value, result), n in counts.items():
        out.setdefault(value, {})[result] = n
    return out


def quarantine_summary(watch: DeathWatch) -> dict[str, Any]:
    """Counts of the quarantine (the entries are at ``GET /routes/quarantine``)."""
    quarantined, suspects = watch.table.counts()
    return {
        "ttl_s": watch.table.ttl_s,
        "quarantined": quarantined,
        "suspects": suspects,
        "quarantined_total": watch.table.quarantined_total,
        "refused": watch.table.refused,
        "deaths": sum(watch.deaths.values()),
    }


@router.post("/routes/explain")
async def explain(request: Request, gateway: GatewayDep, settings: SettingsDep) -> dict[str, Any]:
    """The routing decision for a request body of a routed endpoint, against the live
    backend state, without calling any backend. The body is the request body itself, or
    ``{"body": {...}, "headers": {"X-Task-Type": ...}, "endpoint": "/v1/messages"}``
    (without ``endpoint`` it is guessed from the body); ``X-Task-Type`` and
    ``X-Specgate-Speculation`` headers on this request count too. A quarantined body is
    the 422 the endpoint answers."""
    payload = parse_json(await read_body(request.receive, request.headers, settings.max_body_bytes))
    headers = {k.lower(): v for k, v in request.headers.items()}
    endpoint = None
    if isinstance(payload, dict) and "body" in payload and not isinstance(payload["body"], dict):
        raise bad_request("'body' must be the request body, a JSON object.", param="body")
    if isinstance(payload, dict) and isinstance(payload.get("body"), dict):
        extra, endpoint = payload.get("headers"), payload.get("endpoint")
        if not isinstance(extra, dict | None):
            raise bad_request("'headers' must be a JSON object of header names.", param="headers")
        if not isinstance(endpoint, str | None):
            raise bad_request("'endpoint' must be a path such as /v1/messages.", param="endpoint")
        headers |= {str(k).lower(): str(v) for k, v in (extra or {}).items()}
        payload = payload["body"]
    runtime = runtime_of(request.app)
    if runtime.deaths.table.blocking and isinstance(payload, dict):
        refuse_quarantined(runtime.deaths.table, endpoint or kind_of(payload).path, payload)
    return gateway.explain(payload, headers, endpoint, runtime.affinity)


@router.post("/routes/reload")
async def reload(gateway: GatewayDep, settings: SettingsDep) -> dict[str, Any]:
    """Re-read the config file and swap it in. An invalid file is refused with a 400 listing
    its validation errors (``error.issues``), and the running config stays."""
    try:
        config = settings.load_config()
    except ConfigError as exc:
        raise config_invalid(exc) from None
    gateway.reload(config)
    return {
        "reloaded": True,
        "config": str(settings.config),
        "reloads": gateway.reloads,
        "backends": list(config.backends),
        "rules": [r.name for r in config.rules],
    }
