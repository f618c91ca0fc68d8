"""A routed request's stages, from its body to the answer the client gets.

One :class:`RoutedRequest` value passes two stages (vLLM's ``OpenAIServing`` passes a
``ServeContext`` through its ``_pipeline`` the same way):

* :func:`prepare_routed`: parse, quarantine, read the routed fields and features, decide,
  apply the known-engine-bug guards, pin a seeded request and a Responses conversation,
  apply the client's speculation control (the last five through
  :class:`~gateway.service.Gateway`'s ``prepare``, ``decide`` and ``route``, which
  ``/routes/explain`` runs too), then ask for the usage chunk feedback needs;
* :func:`open_routed`: the forwarder opens the decided backends in order with failover
  before the first byte (:class:`~gateway.upstream.forward.Forwarder`, a backend lease per
  attempt), :class:`~gateway.settle.Settle` judges the first answer (a speculation refusal
  is routed again, a Responses id remembered), and the decision counters are written here
  (serving backend, failovers, last resort).

What is left to the HTTP layer (:mod:`gateway.api.openai`) is reading the body and sending
the answer.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.classify.features import SPECULATION_ON
from gateway.classify.protocol import RoutedFields, read_fields
from gateway.errors import GatewayError, bad_request, no_backend, quarantined, too_busy
from gateway.routing.control import served
from gateway.routing.explain import decision_json
from gateway.routing.guards import needs_token_count
from gateway.routing.policy import CohortMember, RouteDecision
from gateway.routing.seeds import seeded
from gateway.runtime import Runtime
from gateway.service import Gateway, held_by
from gateway.settle import Settle
from gateway.trace import RequestTrace
from gateway.upstream.answer import Upstream
from gateway.upstream.feedback import ResponseTap, fingerprints_known, with_usage
from gateway.upstream.live_scoring import Wrap, unchanged
from gateway.upstream.quarantine import QuarantineTable, fingerprint
from gateway.upstream.tokens import count_prompt_tokens

logger = logging.getLogger(__name__)
#: One DEBUG line per routed request (``SPECGATE_LOG_LEVEL=debug``): its id, the load it
#: joined and its decision as ``/routes/explain`` gives it, so a run can be read back
#: decision by decision (e.g. why a wave split over two servers of one GPU).
decision_log = logging.getLogger("specgate.decision")

#: Response headers the gateway sets itself (a backend's own are dropped).
OWN_HEADERS = frozenset(
    {
        b"x-specgate-backend",
        b"x-specgate-rule",
        b"x-specgate-task",
        b"x-specgate-guarded",
        b"x-specgate-last-resort",
        b"x-specgate-speculation",
        b"x-request-id",
    }
)


@dataclass(slots=True)
class RoutedRequest:
    """One routed request as the stages see it: its endpoint (``kind``, ``path``), the body
    as it goes upstream (``raw``: the client's bytes, with the usage chunk asked for when
    feedback needs it) and as parsed (``body``), the client's headers (text, the first of
    repeated ones), its ``trace``; then what :func:`prepare_routed` decided."""

    kind: type[RoutedFields]
    path: str
    raw: bytes
    headers: dict[str, str]
    trace: RequestTrace
    body: dict[str, Any] | None = None
    decision: RouteDecision | None = None
    tap: ResponseTap | None = None
    settle: Settle | None = None

    @property
    def stream(self) -> bool:
        """Whether the client asked for a stream (as read by the routed fields)."""
        return self.trace.stream


async def prepare_routed(runtime: Runtime, request: RoutedRequest) -> None:
    """The prepare stage (see the module docstring): fills ``request``'s ``body``,
    ``decision``, ``tap`` and ``settle``. Raises
    :class:`~gateway.errors.GatewayError`: 400 (bad JSON, a guard, the speculation
    control), 404 (unknown model), 422 (quarantined), 429/503 (no backend can take it)."""
    gateway, trace = runtime.gateway, request.trace
    body = request.body = parse_json(request.raw)
    fields = read_fields(request.kind, body)
    trace.stream = bool(fields.stream)
    if runtime.deaths.table.blocking:
        refuse_quarantined(runtime.deaths.table, request.path, body)
    headers = request.headers
    prepared = gateway.prepare(request.kind, body, headers, fields)
    features, arrivals = prepared.features, gateway.arrivals
    model, cap = features.model, gateway.policy.cohort_cap(features.model)
    # a burst's first request is routed for the burst (gateway.arrivals): after a quiet spell
    # it forms a cohort, which the next ones join up to its cap (past it, the burst is known
    # to be large: they go at once), and is chosen for their mix of tasks; one asking for
    # speculation goes there whatever the load, so it neither waits nor counts. Each
    # decision is reserved before any await: requests arriving together see each other (a
    # waiting cohort member resumes only after the request that set its event has reached
    # the next await).
    if (
        cap > 1
        and features.speculation != SPECULATION_ON
        and (arrivals.arriving(model) < cap if model in arrivals.forming else gateway.quiet(model))
    ):
        pinned = seeded(body, gateway.config.defaults.temperature)
        member = CohortMember(features, prepared.prompt, pinned)
        with arrivals.enter(model, member):
            led = await arrivals.settle(model, cap)
            arriving = arrivals.arriving(model) - 1
            # the cohort's first is chosen for the mix of those waiting for it
            cohort = [m for m in arrivals.members(model) if m is not member] if led else []
            decision = gateway.decide(features, prepared.prompt, arriving=arriving, cohort=cohort)
    else:
        decision = gateway.decide(features, prepared.prompt, arriving=arrivals.arriving(model))
    first = decision.backend
    _reserve(gateway, first)  # no await since the decision: the cohort's next ones see it
    tokens = None
    if gateway.config.guards:  # most configs: no coroutine to await
        tokens = await prompt_tokens(gateway, runtime.client, decision, request.path, body)
    held = held_by(runtime.affinity, request.kind, body)
    routed = gateway.route(decision, prepared, request.path, tokens=tokens, held=held)
    if routed.error is not None:
        raise routed.error
    decision = routed.decision
    gateway.probed(decision)
    trace.task, trace.rule = prepared.features.task, decision.rule
    trace.features, trace.prompt = prepared.features, prepared.prompt
    trace.concurrency = decision.concurrency
    if not decision.backends:
        gateway.stats.rejected += 1
        if decision.saturated:
            raise too_busy("Every backend for this request is at its in-flight cap.")
        raise no_backend()
    runtime.capture.offer(request.path, prepared.features.task, body, len(request.raw))
    headers["x-request-id"] = trace.request_id
    request.decision = decision
    if decision.backends[0] != first:  # a guard, a pin or the client moved it
        _reserve(gateway, decision.backends[0], instead_of=first)
    # after the move: this request's own reservation is not another server's load
    trace.shared = gateway.shares_compute(decision.backends[0])
    trace.mark = gateway.compute_mark(decision.backends[0])
    if decision_log.isEnabledFor(logging.DEBUG):
        line = {"request_id": trace.request_id, "concurrency": decision.concurrency}
        decision_log.debug("%s", json.dumps(line | decision_json(decision)))
    _ask_for_feedback(runtime, request)


def _reserve(gateway: Gateway, name: str | None, instead_of: str | None = None) -> None:
    """Count a routing decision as in flight on backend ``name`` until its attempt begins
    (:meth:`~gateway.upstream.state.BackendState.reserve`), moving the reservation from
    ``instead_of`` when the decision changed; a request refused meanwhile lets it expire.
    Backends of a compute group also note the group's in-flight total as their peak, so a
    wave split over two servers still reads as one wave of its whole size next time."""
    states, groups = gateway.registry.states, gateway.policy.groups
    if instead_of is not None and instead_of in states:
        states[instead_of].unreserve()
    if name is None or name not in states:
        return
    now = time.monotonic()
    states[name].reserve(now)
    group = groups.get(name)
    if group is not None:  # the group's peak, split or not: what routing reads as its load
        load = sum(s.load(now) for n, s in states.items() if groups.get(n) == group)
        states[name].note_load(now, load)


def _ask_for_feedback(runtime: Runtime, request: RoutedRequest) -> None:
    """Set ``request``'s feedback tap (wrapped for live scoring,
    :meth:`~gateway.upstream.live_scoring.LiveScorer.attach`) and its :class:`Settle`. A stream
    ends with the usage chunk (and vLLM's per-request acceptance) only if asked for: ask,
    uncompressed, and the tap removes it again, once the first choice's fingerprint is known
    (:mod:`gateway.upstream.feedback`). Not every backend's: the try list ends with every
    backend of the model (last-resort failover targets), so a stream's feedback would wait
    until each had answered once."""
    gateway, trace, decision = runtime.gateway, request.trace, request.decision
    assert decision is not None and request.body is not None
    registry, strip = gateway.registry, False
    if gateway.config.routing.feedback and request.kind.feedback:
        forced = None
        if fingerprints_known(registry, decision.backends[:1]):
            forced = with_usage(request.raw, request.body)
        if forced is not None:
            request.raw, request.headers["accept-encoding"] = forced, "identity"
        strip = forced is not None
        request.tap = ResponseTap(trace, strip=strip, registry=registry)
    tapped = request.tap is not None
    # the distribution canary may score this answer's sampled tokens (live scoring)
    scorer = runtime.live_scoring
    live: Wrap = unchanged
    taken = scorer and scorer.attach(
        request.path, request.body, request.raw, decision.backends[0], trace
    )
    if taken:
        (request.raw, live), request.headers["accept-encoding"] = taken, "identity"
    request.tap = live(request.tap)
    request.settle = Settle(
        gateway,
        request.kind,
        request.body,
        decision.features,
        trace,
        lambda: live(ResponseTap(trace, strip=strip, registry=registry) if tapped else None),
        runtime.affinity,
    )


def parse_json(raw: bytes) -> Any:
    """Decode a JSON body; malformed JSON, invalid UTF-8 or absurd nesting is a 400."""
    try:
        return json.loads(raw)
    except ValueError:
        raise bad_request("The request body is not valid JSON.", code="invalid_json") from None
    except RecursionError:
        raise too_deep() from None


def too_deep() -> GatewayError:
    """The 400 for a JSON body nested deeper than Python's parser goes (the routed and the
    relayed paths alike: vLLM's own parser fails on it with a 500 or FastAPI's
    ``{"detail": ...}``, neither in OpenAI's envelope)."""
    return bad_request(
        "The request body nests JSON arrays or objects too deeply.", code="invalid_json"
    )


async def prompt_tokens(
    gateway: Gateway, client: httpx.AsyncClient, decision: RouteDecision, path: str, body: Any
) -> int | None:
    """The exact prompt length for the config's guards, from the first candidate's
    ``/tokenize``; None (the guards use the cheap bound) unless that bound alone would make
    a guard match."""
    if not decision.backends or not needs_token_count(gateway.config, decision, body):
        return None
    backend = gateway.config.backends[decision.backends[0]]
    return await count_prompt_tokens(client, backend.base_url, path, body)


async def guard_decision(
    gateway: Gateway, client: httpx.AsyncClient, decision: RouteDecision, path: str, body: Any
) -> RouteDecision:
    """Apply the known-engine-bug guards (:meth:`~gateway.service.Gateway.guard`) with the
    :func:`prompt_tokens` of ``body``."""
    tokens = await prompt_tokens(gateway, client, decision, path, body)
    return gateway.guard(decision, body, tokens)


def refuse_quarantined(table: QuarantineTable, path: str, body: Any) -> None:
    """Raise the 422 ``request_quarantined`` error when ``body`` (for ``path``) is
    quarantined; only called while the table holds a quarantined fingerprint."""
    fp = fingerprint(path, body)
    entry = table.check(fp)
    if entry is None:
        return
    death = entry.deaths[-1]
    remaining = (entry.quarantined_until or 0.0) - table.clock()
    logger.info("refused quarantined request, fingerprint %s", fp)
    raise quarantined(fp, death.backend, death.signal, remaining)


async def open_routed(
    runtime: Runtime, request: RoutedRequest
) -> tuple[Upstream, list[tuple[bytes, bytes]]]:
    """The open stage: open the prepared ``request``'s backends in its decision's order
    (failing over before the first byte), let its ``settle`` judge the first answer (a
    refusal it retries elsewhere), and return the answer with the response headers to send
    (ASGI byte pairs): the backend's, except the gateway's own ``x-specgate-*`` and
    ``x-request-id``, which are set here (``x-specgate-last-resort`` only when a backend
    outside the rule's pools answers: why the rule's pools did not). The caller owns the
    answer and closes it (``async with``); an answer replaced on the way (a peeked or
    refused one) is closed by the one that replaced it, or by ``settle``. Raises
    :class:`~gateway.failures.UpstreamFailure` when no backend answers (from the
    forwarder)."""
    gateway, decision, settle = runtime.gateway, request.decision, request.settle
    assert decision is not None and settle is not None, "prepare_routed first"

    def count_failover(_backend: str, _why: str) -> None:
        gateway.stats.failovers += 1

    async def open_on(order: tuple[str, ...], tap: ResponseTap | None) -> Upstream:
        return await runtime.forwarder.open(
            gateway.config.backends,
            gateway.registry.states,
            order,
            path=request.path,
            body=request.raw,
            headers=request.headers,
            trace=request.trace,
            on_failure=count_failover,
            tap=tap,
            request=request.body,
            timed=True,
        )

    async def reopen_on(order: tuple[str, ...], tap: ResponseTap | None) -> Upstream:
        gateway.stats.failovers += 1  # a refusal routed again
        return await open_on(order, tap)

    # settle owns the first answer from here: it closes whatever it holds on any error
    upstream = await settle.settle(await open_on(decision.backends, request.tap), reopen_on)
    try:
        return upstream, answer_headers(gateway, decision, upstream, request.trace.request_id)
    except BaseException:
        await upstream.aclose()
        raise


def answer_headers(
    gateway: Gateway, decision: RouteDecision, upstream: Upstream, request_id: str
) -> list[tuple[bytes, bytes]]:
    """The response headers of ``upstream``'s answer to a request routed by ``decision``
    (see :func:`open_routed`); counts the serving backend and a last-resort answer."""
    gateway.stats.by_backend[upstream.backend] += 1
    out = [(k, v) for k, v in upstream.headers if k not in OWN_HEADERS]
    out += [
        (b"x-specgate-backend", upstream.backend.encode()),
        (b"x-specgate-rule", decision.rule.encode()),
        (b"x-specgate-task", decision.features.task.encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if decision.guarded:  # which backends a known engine bug kept this request from
        guarded = ", ".join(f"{b}={g}" for b, g in decision.guarded)
        out.append((b"x-specgate-guarded", guarded.encode()))
    if decision.speculation is not None:  # the effect of the client's control
        effect = served(gateway.config, decision.speculation, upstream.backend)
        out.append((b"x-specgate-speculation", header_value(effect)))
    if upstream.backend in decision.outside:  # why the rule's pools did not serve it
        gateway.stats.last_resort += 1
        why = decision.last_resort or "failover: the rule's backends did not answer"
        out.append((b"x-specgate-last-resort", header_value(why)))
    return out


def header_value(text: str) -> bytes:
    """``text`` as a safe header value: ASCII (others backslash-escaped), no control
    characters (a config's names cannot split or corrupt the response head)."""
    raw = text.encode("ascii", "backslashreplace")
    return bytes(c for c in raw if 32 <= c < 127)
