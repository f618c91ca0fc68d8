"""Admin endpoints: what the gateway routes to and why."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.api.deps import GatewayDep

router = APIRouter(tags=["admin"])


@router.get("/routes")
async def routes(gateway: GatewayDep) -> dict[str, Any]:
    """Every backend (URL, model, speculation, health, in-flight), the ordered rules, the
    pools, and decision counts per rule, task and serving backend since start."""
    config = gateway.config
    backends = []
    for name, backend in config.backends.items():
        state = gateway.registry.states[name]
        backends.append(
            {
                "name": name,
                "url": backend.base_url,
                "model": backend.served_model,
                "local": backend.local,
                "speculation": backend.spec.model_dump(exclude_none=True),
                "healthy": state.healthy,
                "last_error": state.last_error,
                "inflight": state.inflight,
                "requests": gateway.stats.by_backend[name],
            }
        )
    rules = [rule.model_dump(exclude_none=True) for rule in config.rules]
    rules.append({"name": "default", "match": {}, "pool": config.defaults.pool, "fallbacks": []})
    stats = gateway.stats
    return {
        "backends": backends,
        "pools": config.pools,
        "rules": rules,
        "defaults": config.defaults.model_dump(),
        "decisions": {
            "by_rule": dict(stats.by_rule),
            "by_task": dict(stats.by_task),
            "by_backend": dict(stats.by_backend),
            "failovers": stats.failovers,
            "rejected": stats.rejected,
        },
    }
