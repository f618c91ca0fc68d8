"""Admin endpoints of containment: list and clear quarantined request fingerprints."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.api.deps import RuntimeDep
from gateway.errors import GatewayError

router = APIRouter(tags=["admin"])


@router.get("/routes/quarantine")
async def list_quarantine(runtime: RuntimeDep) -> dict[str, Any]:
    """The quarantine table: settings (``ttl_s``, ``max_entries``, ``strikes``), counts
    (``quarantined``, ``suspects``, ``quarantined_total``, ``refused``) and every live
    entry (fingerprint, endpoint, state, strikes, seconds left, refusals, deaths). Holds
    hashes only, never request content."""
    return runtime.deaths.table.to_json()


@router.delete("/routes/quarantine")
async def clear_quarantine(runtime: RuntimeDep) -> dict[str, int]:
    """Forget every fingerprint (quarantined and suspects): ``{"cleared": N}``."""
    return {"cleared": runtime.deaths.table.clear()}


@router.delete("/routes/quarantine/{fingerprint}")
async def clear_fingerprint(runtime: RuntimeDep, fingerprint: str) -> dict[str, int]:
    """Forget one fingerprint: ``{"cleared": 1}``, or 404 when it is not in the table."""
    if not runtime.deaths.table.clear(fingerprint):
        raise GatewayError(
            404, f"Fingerprint {fingerprint} is not in the quarantine.", code="not_found"
        )
    return {"cleared": 1}
