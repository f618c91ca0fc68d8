"""How long the gateway keeps idle connections to the vLLM servers a stack launches.

The gateway drops an idle pooled connection to a backend after ``backend_keep_alive_s``
(4 s by default: under vLLM's own idle timeout, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s, so it
never sends a request on a connection the server is closing). A burst that finds the pool
empty connects first, and those connects wait for the burst's last routing decision: waves
of 64 five seconds apart got their first token 47 ms after direct at 4 s, 21 ms at 60 s
(Python 3.12, docs/benchmarks.md section 7, "Session 20 on this machine").

Where specgate launches the servers itself (``specgate up``, and the compose and Kubernetes
files it generates) it sets their idle timeout, so it can keep connections longer: every
launched server gets an idle timeout :data:`IDLE_MARGIN_S` above the gateway's keep-alive,
and the gateway keeps :data:`LAUNCHED_KEEP_ALIVE_S` when it launched every backend and none
sets its own idle timeout (a server run elsewhere keeps vLLM's 5 s).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from contracts.launch_profile import BackendProfile

#: vLLM's environment variable for its HTTP server's idle timeout (whole seconds; 5 by
#: default: vllm/envs.py in 0.26 and 0.32).
IDLE_TIMEOUT_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
#: How much longer (seconds) a launched server keeps an idle connection than the gateway, so
#: the gateway drops one before the server may close it under a request.
IDLE_MARGIN_S = 5.0
#: The gateway's ``backend_keep_alive_s`` when it launched every backend (seconds).
LAUNCHED_KEEP_ALIVE_S = 60.0


def launched_keep_alive_s(profiles: Iterable[BackendProfile | None]) -> float | None:
    """:data:`LAUNCHED_KEEP_ALIVE_S` when every backend is launched (``profiles``: each
    backend's launch profile, None for a server run elsewhere) and none sets
    :data:`IDLE_TIMEOUT_ENV` in its ``env``; else None (keep the gateway's setting)."""
    launched = all(p is not None and IDLE_TIMEOUT_ENV not in p.env for p in profiles)
    return LAUNCHED_KEEP_ALIVE_S if launched else None


def with_idle_timeout(profile: BackendProfile, keep_alive_s: float) -> BackendProfile:
    """``profile`` with :data:`IDLE_TIMEOUT_ENV` at ``keep_alive_s`` + :data:`IDLE_MARGIN_S`
    (rounded up to whole seconds) in its ``env``, unless the profile sets it."""
    idle = {IDLE_TIMEOUT_ENV: str(math.ceil(keep_alive_s + IDLE_MARGIN_S))}
    return profile.model_copy(update={"env": idle | profile.env})
