"""Live per-backend state shared by the poller, the forwarder and the admin API."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import httpx

from contracts.acceptance import AcceptanceStats, AcceptanceWindow
from contracts.config import GatewayConfig
from gateway.routing.policy import BackendSnapshot
from gateway.upstream.circuit import CircuitBreaker

#: A backend's health, the one definition every reader uses (routing, ``/ready``,
#: ``/routes``, ``/status``, ``/metrics``, pass-through, the canary): ``up`` once a
#: ``/health`` probe passed, ``down`` after a refused or non-200 probe, several slow ones in a
#: row while it sent nothing (:class:`~gateway.upstream.health.HealthPoller`), or a death under
#: a request; ``unknown`` before the first probe (a backend added by a reload).
Health = Literal["up", "down", "unknown"]
HEALTH_STATES: tuple[Health, ...] = ("up", "down", "unknown")
#: Seconds a backend's peak in-flight count is remembered (10-20 s: two slots of this length).
#: Routing reads the load a request joins as the higher of the batch now and this recent
#: peak, so the first requests of a burst are routed for the burst, not for an idle server
#: (a wave of c requests arrives within milliseconds; docs/benchmarks.md, section 7).
PEAK_WINDOW_S = 10.0
#: Seconds a routing decision counts as in flight on its backend before its attempt begins
#: (a guard or a connection lies between them): requests that arrive together see each
#: other's choices, so a burst is not spread by decisions that all saw an idle server.
RESERVE_S = 2.0
#: Weight of the newest answered request's duration in a backend's running mean
#: (:attr:`BackendState.duration_s`, an exponentially weighted mean).
DURATION_WEIGHT = 0.2


def health_of(healthy: bool | None) -> Health:
    """The :data:`Health` of a last probe verdict (``None``: not probed yet)."""
    if healthy is None:
        return "unknown"
    return "up" if healthy else "down"


@dataclass(slots=True)
class BackendState:
    """Mutable live state of one backend (owned by the event loop; no locking needed).

    ``healthy`` is the health probes' verdict (``None`` before the first probe); read it
    through :attr:`health` and :attr:`available` (an ``unknown`` backend is routed, so a
    fresh or reloaded gateway does not refuse traffic, and reported as unknown);
    ``inflight`` counts this gateway's requests currently sent to the backend; ``running``,
    ``waiting`` and ``kv_cache_usage`` come from the last ``/metrics`` scrape; ``acceptance`` is the
    windowed acceptance of a speculative backend; ``demotions`` counts how often it fell
    under its acceptance floor; ``suspect`` is set by the correctness canary when the
    backend's greedy output diverged from its plain twin's beyond numerics (not routed);
    ``sample_suspect`` is set by the distribution canary when its sampled tokens are not
    samples of the target (no request with temperature > 0 is routed there).
    ``scraped_at`` (``time.monotonic()``): when ``/metrics`` was last read (:meth:`scraped`);
    ``foreign`` and ``foreign_prev``: the requests there not this gateway's at that scrape and
    the one before (other clients', other replicas'), which routing reads through
    :meth:`foreign_load`.
    ``probe_failures``: ``/health`` probes failed in a row (timeouts and broken answers;
    see :class:`~gateway.upstream.health.HealthPoller`); ``alive_at`` (``time.monotonic()``):
    when the backend last settled an answer or sent a body chunk to this gateway (passive
    liveness: a backend answering requests is alive, however slow its probe).
    ``duration_s``: the running mean time (seconds, :data:`DURATION_WEIGHT`) this gateway's
    answered requests held the backend (0 until one was), by which a scrape ages.
    ``taken`` and ``ended``: this gateway's generations there that have begun and that have
    ended (counts, never reset; pass-through requests such as ``/tokenize`` not counted), by
    which :meth:`gateway.service.Gateway.learn` tells what ran on a compute group during one
    request's life.
    ``fingerprint``: the ``system_fingerprint`` its answers carry, as JSON text (``b""``:
    none; None: not seen yet), learnt by :class:`~gateway.upstream.feedback.ResponseTap`.
    ``down_listeners``: callbacks (no argument) run by :meth:`mark` when it goes down:
    attempts waiting there for an answer give up
    (:meth:`~gateway.upstream.attempt.Attempt.given_up_when_down`).
    ``idle_listeners``: callbacks (no argument) run by :meth:`release` when its last
    request in flight ends (the distribution canary waiting for quiet beside it,
    :class:`~gateway.upstream.sample_canary.SampleCanary`).
    """

    healthy: bool | None = None
    inflight: int = 0
    last_error: str | None = None
    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0
    last_scrape: float | None = None
    window: AcceptanceWindow = field(default_factory=AcceptanceWindow)
    acceptance: AcceptanceStats | None = None
    demoted: bool = False
    demotions: int = 0
    circuit: CircuitBreaker = field(default_factory=CircuitBreaker)
    suspect: str | None = None
    sample_suspect: str | None = None
    scraped_at: float = 0.0
    foreign: float = 0.0
    foreign_prev: float = 0.0
    duration_s: float = 0.0
    probe_failures: int = 0
    alive_at: float = 0.0
    fingerprint: bytes | None = None
    reserved: list[float] = field(default_factory=list)
    taken: int = 0
    ended: int = 0
    peak: int = 0
    peak_prev: int = 0
    peak_since: float = -2 * PEAK_WINDOW_S
    peak_window_s: float = PEAK_WINDOW_S
    down_listeners: set[Callable[[], None]] = field(default_factory=set, repr=False)
    idle_listeners: set[Callable[[], None]] = field(default_factory=set, repr=False)

    @property
    def health(self) -> Health:
        """``up``, ``down`` or ``unknown`` (see :data:`Health`)."""
        return health_of(self.healthy)

    @property
    def available(self) -> bool:
        """Health lets it take traffic: up, or not probed yet (only ``down`` keeps it out;
        the circuit breaker, demotion and the canary are separate verdicts)."""
        return self.healthy is not False

    def mark(self, healthy: bool, *, release: bool = True) -> None:
        """Record a health verdict (the poller's, or a death's); going down (False after
        True or None) with ``release`` runs every :attr:`down_listeners` callback (each wait
        removes its own when it ends), so the requests waiting there move on. ``release``
        is False for a backend down only because its probes were slow: a busy server's
        ``/health`` can be, while it still works on requests that send nothing until they
        end (non-streamed ones, streams in prefill), and giving those up would throw their
        work away and pile it onto the next backend. A backend already down is left alone:
        a request sent there since (an affinity pin) waits for its own answer, as before."""
        went_down = release and not healthy and self.healthy is not False
        self.healthy = healthy
        if went_down and self.down_listeners:
            for listener in tuple(self.down_listeners):
                listener()

    def reserve(self, now: float) -> None:
        """A routing decision chose this backend (``now``: ``time.monotonic()``): it counts
        as in flight until an attempt begins there, or :data:`RESERVE_S` at most."""
        self.reserved = [t for t in self.reserved if now - t < RESERVE_S]
        self.reserved.append(now)

    def load(self, now: float) -> int:
        """This gateway's requests there: in flight, plus decisions not yet forwarded (their
        reservations younger than :data:`RESERVE_S`)."""
        return self.inflight + sum(now - t < RESERVE_S for t in self.reserved)

    def unreserve(self) -> None:
        """The newest reservation went elsewhere (the decision changed before forwarding)."""
        if self.reserved:
            self.reserved.pop()

    def take(self, now: float, counted: bool = True) -> None:
        """One more of this gateway's requests there (``now``: ``time.monotonic()``); keeps
        the in-flight peak of the current :data:`PEAK_WINDOW_S` slot and of the one before,
        and ends the oldest reservation; ``counted`` (a generation): in :attr:`taken`."""
        if self.reserved:
            del self.reserved[0]
        self.inflight += 1
        self.taken += counted
        self.note_load(now, self.inflight)

    def note_load(self, now: float, load: int) -> None:
        """Keep ``load`` (requests in flight there, or on its whole compute group when a
        request was routed here) in the current :data:`PEAK_WINDOW_S` slot's peak."""
        age, window = now - self.peak_since, self.peak_window_s
        if age >= window:
            self.peak_prev = self.peak if age < 2 * window else 0
            self.peak, self.peak_since = 0, now
        self.peak = max(self.peak, load)

    def recent_peak(self, now: float) -> int:
        """The most of this gateway's requests in flight there at once over the last
        :data:`PEAK_WINDOW_S` to twice that (0 when none was sent for that long)."""
        age, window = now - self.peak_since, self.peak_window_s
        if age >= 2 * window:
            return 0
        return self.peak if age >= window else max(self.peak, self.peak_prev)

    def release(self, duration_s: float | None = None, counted: bool = True) -> None:
        """One of this gateway's requests there has ended, after ``duration_s`` seconds
        (None: not timed) in flight: kept in :attr:`duration_s`'s running mean; ``counted``
        (a generation): in :attr:`ended`. The last one out runs every
        :attr:`idle_listeners` callback (the distribution canary waiting for quiet beside
        this server)."""
        self.inflight -= 1
        self.ended += counted
        if self.inflight == 0 and self.idle_listeners:
            for listener in tuple(self.idle_listeners):
                listener()
        if duration_s is not None and duration_s >= 0:
            mean = self.duration_s
            self.duration_s = (
                duration_s if mean <= 0 else mean + DURATION_WEIGHT * (duration_s - mean)
            )

    def scraped(self, running: float, waiting: float, now: float) -> None:
        """A ``/metrics`` scrape at ``now`` (``time.monotonic()``) read ``running`` and
        ``waiting`` requests there (vLLM's ``vllm:num_requests_running`` and ``_waiting``):
        kept as read for the views, and what is not this gateway's (``running + waiting``
        less its requests in flight there now, at least 0) becomes :attr:`foreign`, the
        previous one :attr:`foreign_prev`."""
        self.running, self.waiting, self.scraped_at = running, waiting, now
        self.foreign_prev = self.foreign
        self.foreign = max(0.0, running + waiting - self.inflight)

    def foreign_load(self, now: float) -> float:
        """Other clients' requests expected there at ``now`` (``time.monotonic()``), from
        the last two scrapes: what both saw (the lower count, 2 s apart at the default
        probe interval) is taken as steady traffic that goes on (another replica's, say);
        the rest of the last one ages as ``exp(-age / duration_s)``, the share of requests
        still running ``age`` seconds later when their remaining times are exponential with
        the mean duration of this gateway's own answered requests there (the exponential's
        memoryless law; an assumption, and other clients' requests timed by ours: requests
        of about one length leave nearer ``1 - age / duration_s``, which ``exp`` exceeds,
        so it errs towards counting load that has gone). Returned as scraped until one of
        ours was answered there (no duration known), and for a scrape not older than
        ``now``.

        Without the ageing, a scrape taken while another client's wave ran counted that wave
        for up to a probe interval after it ended: on the GPU twin (docs/benchmarks.md
        section 7, thirteenth run, the bench's single backends served between the gateway's
        waves) 80 of the 192 measured requests sent one at a time read as a batch of 2-3, and
        12 of 48 waves of 4 were kept off EAGLE-3."""
        foreign, age = self.foreign, now - self.scraped_at
        if foreign <= 0 or self.duration_s <= 0 or age <= 0:
            return foreign
        steady = min(foreign, self.foreign_prev)
        return steady + (foreign - steady) * math.exp(-age / self.duration_s)

    def snapshot(self, now: float) -> BackendSnapshot:
        """The immutable view the routing policy reads (``now``: ``time.monotonic()``)."""
        # other clients' requests, to the nearest one (an idle server's aged count rounds to
        # 0: it neither makes its group busy nor bands a lone request), the scrape's queue
        # first counted as theirs
        foreign = round(self.foreign_load(now))
        waiting = min(round(self.waiting), foreign)
        circuit = self.circuit  # closed (no failure run) in the common case: no state read
        return BackendSnapshot(  # positional, in field order (cheaper than keywords)
            self.healthy is not False,  # healthy: available
            circuit.opened_at is not None and not circuit.routable(now),  # circuit_open
            self.load(now) if self.reserved else self.inflight,  # inflight
            float(self.recent_peak(now)),  # recent
            foreign - waiting,  # running (other clients')
            waiting,  # waiting (other clients')
            self.demoted,
            self.acceptance.rate if self.acceptance else None,  # acceptance_rate
            self.suspect,
            self.sample_suspect,
        )


@dataclass(slots=True)
class DecisionStats:
    """Counts of routing outcomes since start: per rule, per task, per serving backend;
    ``last_resort``: answers from a backend outside the request's rule's pools, every
    backend of those being out or failing (:class:`~gateway.routing.policy.RoutingPolicy`
    step 7); ``speculation``: requests carrying ``X-Specgate-Speculation`` per (value,
    result), see :meth:`gateway.service.Gateway.control_of`."""

    by_rule: Counter[str] = field(default_factory=Counter)
    by_task: Counter[str] = field(default_factory=Counter)
    by_backend: Counter[str] = field(default_factory=Counter)
    guarded: Counter[str] = field(default_factory=Counter)  # requests per guard that hit
    speculation: Counter[tuple[str, str]] = field(default_factory=Counter)
    failovers: int = 0
    rejected: int = 0
    last_resort: int = 0


class BackendRegistry:
    """The set of backends' live states, keyed by backend name.

    :meth:`sync` follows a config change: new backends get a fresh state, removed ones are
    dropped, kept ones keep their counters and windows. New states get a circuit breaker
    opening after ``circuit_failures`` consecutive failures for ``circuit_cooldown_s``, and
    remember their in-flight peak for ``peak_window_s`` (:data:`PEAK_WINDOW_S`).
    """

    def __init__(
        self,
        names: Iterable[str],
        *,
        circuit_failures: int = 5,
        circuit_cooldown_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        peak_window_s: float = PEAK_WINDOW_S,
    ) -> None:
        self.states: dict[str, BackendState] = {}
        self.circuit_failures = circuit_failures
        self.circuit_cooldown_s = circuit_cooldown_s
        self.peak_window_s = peak_window_s
        self.clock = clock
        self.sync(names)

    def sync(self, names: Iterable[str]) -> None:
        """Make the registry hold exactly ``names``."""
        self.states = {n: self.states.get(n) or self._new_state() for n in names}

    def available(self) -> list[str]:
        """The backends health lets take traffic (:attr:`BackendState.available`), in
        config order."""
        return [name for name, state in self.states.items() if state.available]

    def _new_state(self) -> BackendState:
        breaker = CircuitBreaker(self.circuit_failures, self.circuit_cooldown_s)
        window = self.peak_window_s
        return BackendState(circuit=breaker, peak_since=-2 * window, peak_window_s=window)

    def snapshot(self) -> dict[str, BackendSnapshot]:
        """Every backend's :class:`BackendSnapshot`, for one routing decision."""
        now = self.clock()
        return {name: state.snapshot(now) for name, state in self.states.items()}


@dataclass(frozen=True, slots=True)
class Backends:
    """The backends as a background loop (health poller, canaries) reaches them: the
    app's shared httpx ``client``, the current ``config`` (a callable, so a reload is
    followed) and their live ``registry``."""

    client: httpx.AsyncClient
    config: Callable[[], GatewayConfig]
    registry: BackendRegistry
