"""Admin endpoints of containment: list and clear quarantined request fingerprints."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.errors import GatewayError
from gateway.runtime import runtime_of
from gateway.upstream.deaths import DeathWatch

router = APIRouter(tags=["admin"])


def _watch(request: Request) -> DeathWatch:
    return runtime_of(request.app).deaths


@router.get("/routes/quarantine")
async def list_quarantine(request: Request) -> dict[str, Any]:
    """The quarantine table: settings (``ttl_s``, ``max_entries``, ``strikes``), counts
    (``quarantined``, ``suspects``, ``quarantined_total``, ``refused``) and every live
    entry (fingerprint, endpoint, state, strikes, seconds left, refusals, deaths). Holds
    hashes only, never request content."""
    return _watch(request).table.to_json()


@router.delete("/routes/quarantine")
async def clear_quarantine(request: Request) -> dict[str, int]:
    """Forget every fingerprint (quarantined and suspects): ``{"cleared": N}``."""
    return {"cleared": _watch(request).table.clear()}


@router.delete("/routes/quarantine/{fingerprint}")
async def clear_fingerprint(request: Request, fingerprint: str) -> dict[str, int]:
    """Forget one fingerprint: ``{"cleared": 1}``, or 404 when it is not in the table."""
    if not _watch(request).table.clear(fingerprint):
        raise GatewayError(
            404, f"Fingerprint {fingerprint} is not in the quarantine.", code="not_found"
        )
    return {"cleared": 1}
