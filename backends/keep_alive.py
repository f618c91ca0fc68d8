"""How long the gateway keeps idle connections to the vLLM servers a stack launches.

The gateway drops an idle pooled connection to a backend after ``backend_keep_alive_s``
(:data:`DEFAULT_KEEP_ALIVE_S`: under vLLM's own idle timeout, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``,
5 s, so it never sends a request on a connection the server is closing). A burst that finds
the pool empty connects first, and those connects wait for the burst's last routing
decision: waves of 64 five seconds apart got their first token 47 ms after direct at 4 s,
21 ms at 60 s (Python 3.12, docs/benchmarks.md section 7, "Session 20 on this machine").

Where specgate launches the servers itself (``specgate up``, and the compose and Kubernetes
files it generates) it sets their idle timeout, so it can keep connections longer
(:func:`gateway_keep_alive_s`, :func:`with_idle_timeout`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from contracts.launch_profile import BackendProfile

#: vLLM's environment variable for its HTTP server's idle timeout (whole seconds; 5 by
#: default: vllm/envs.py in 0.26 and 0.32, passed to uvicorn's ``timeout_keep_alive``).
IDLE_TIMEOUT_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
#: vLLM's default idle timeout (seconds).
VLLM_IDLE_TIMEOUT_S = 5.0
#: The gateway's default ``backend_keep_alive_s`` (gateway/settings.py; a test holds them
#: equal): 0.8 of vLLM's default idle timeout.
DEFAULT_KEEP_ALIVE_S = 4.0
#: How much longer (seconds) a launched server keeps an idle connection than the gateway, so
#: the gateway drops one before the server may close it under a request.
IDLE_MARGIN_S = 5.0
#: The gateway's keep-alive when it launched every backend (seconds).
LAUNCHED_KEEP_ALIVE_S = 60.0
#: The largest share of a server's own idle timeout (a profile's ``env`` setting it) the
#: gateway keeps a connection: 4 s for vLLM's 5, as the default.
OWN_TIMEOUT_SHARE = 0.8


def gateway_keep_alive_s(
    profiles: Iterable[BackendProfile | None], current_s: float, explicit: bool
) -> float:
    """The gateway's keep-alive (seconds) in front of ``profiles`` (each backend's launch
    profile; None for a server run elsewhere, whose idle timeout is not known here).

    Starts from ``current_s``, the gateway's setting; when it was not set ``explicit``ly and
    every backend is launched without an idle timeout of its own, from
    :data:`LAUNCHED_KEEP_ALIVE_S` (the launched servers then get it plus
    :data:`IDLE_MARGIN_S`). Then at most :data:`OWN_TIMEOUT_SHARE` of any launched profile's
    own idle timeout, so that server still outlasts the gateway's idle connections. An
    explicit setting above a server run elsewhere is the operator's to keep below its idle
    timeout.
    """
    profiles = list(profiles)
    keep = current_s
    own = [own_idle_timeout_s(p) for p in profiles if p and IDLE_TIMEOUT_ENV in p.env]
    if not explicit and not own and all(p is not None for p in profiles):
        keep = LAUNCHED_KEEP_ALIVE_S
    return min([keep, *(OWN_TIMEOUT_SHARE * t for t in own if t is not None)])


def own_idle_timeout_s(profile: BackendProfile) -> float | None:
    """The idle timeout ``profile``'s ``env`` sets (seconds), None when it sets none or one
    vLLM cannot read (an integer is required: such a server fails at start, saying why)."""
    value = profile.env.get(IDLE_TIMEOUT_ENV)
    return float(value) if value is not None and value.strip().isdigit() else None


def with_idle_timeout(profile: BackendProfile, keep_alive_s: float) -> BackendProfile:
    """``profile`` with :data:`IDLE_TIMEOUT_ENV` at ``keep_alive_s`` + :data:`IDLE_MARGIN_S`
    (rounded up to whole seconds) in its ``env``, unless the profile sets it."""
    idle = {IDLE_TIMEOUT_ENV: str(math.ceil(keep_alive_s + IDLE_MARGIN_S))}
    return profile.model_copy(update={"env": idle | profile.env})
