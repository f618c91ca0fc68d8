"""What happens between a backend's settled answer and the first byte to the client.

Two things the routed endpoints need that plain forwarding does not give:

* **speculation refusals**: a speculative backend answers a request it cannot serve with a
  400 whose error message names speculative decoding (a stream: 200, then an error event;
  :func:`~gateway.speculation.spec_params.refusal_message`: answer text and client input
  quoted in a validation error never count). The gateway
  routes the request again without that speculation method, the client gets the plain
  backend's answer as if nothing happened (the refused attempt is not traced or counted as
  served), and, when that answer is a 200, learns the parameters named
  (:class:`~gateway.speculation.spec_params.SpecParams`).
* **Response affinity**: a ``POST /v1/responses`` answer's id is remembered with the backend
  that holds it (:class:`~gateway.upstream.affinity.ResponseAffinity`), and a request with a
  known ``previous_response_id`` is pinned there (:func:`pin`).

Only answers from speculative backends and Responses answers are looked at; everything else
is returned untouched.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.classify.features import RequestFeatures
from gateway.classify.protocol import ResponsesFields, RoutedFields
from gateway.service import Gateway
from gateway.speculation.spec_params import refusal_message
from gateway.trace import RequestTrace
from gateway.upstream.affinity import ResponseAffinity, response_id
from gateway.upstream.answer import Upstream
from gateway.upstream.feedback import ResponseTap
from gateway.upstream.peek import is_event_stream, peek_body, peek_event

logger = logging.getLogger(__name__)

#: Opens the request on an ordered list of backends (with a fresh response tap); the caller
#: counts a call for a retry as a failover (:func:`gateway.pipeline.open_routed`).
Opener = Callable[[tuple[str, ...], ResponseTap | None], Awaitable[Upstream]]
#: A stranger's backend that named no parameter: still never retried on that method.
UNNAMED = "(parameter not named by the backend)"


@dataclass(slots=True)
class Settle:
    """Settles one routed request's answer (see the module docstring).

    ``make_tap`` builds a fresh feedback tap for a retry (None when feedback is off).
    """

    gateway: Gateway
    kind: type[RoutedFields]
    body: dict[str, Any]
    features: RequestFeatures
    trace: RequestTrace
    make_tap: Callable[[], ResponseTap | None]
    affinity: ResponseAffinity | None

    async def settle(self, upstream: Upstream, open_on: Opener) -> Upstream:
        """The answer to relay: ``upstream``, or the answer of a retry after a refusal.

        Owns every answer it holds: on any exception (cancellation included) the one in
        hand, a retry's too, is closed (its backend lease ended) before the error goes on.
        """
        refused_methods: set[str] = set()
        named: dict[str, tuple[str, ...]] = {}  # by refusing method: learnt once served
        current = upstream
        try:
            while True:
                refusal, current = await self._refusal(current)
                if refusal is None:
                    break
                retried = await self._retry(current, refusal, refused_methods, named, open_on)
                if retried is None:
                    break  # nothing else can serve it: the client gets the refusal
                current = retried
            if named:
                self._learn(current, named)
            if self.affinity is not None and self.kind is ResponsesFields:
                if current.status == 200:
                    current = await self._remember(current, self.affinity)
            return current
        except BaseException:
            await current.aclose()  # idempotent
            raise

    async def _refusal(self, upstream: Upstream) -> tuple[str | None, Upstream]:
        backend = self.gateway.config.backends.get(upstream.backend)
        if backend is None or not backend.spec.speculative:
            return None, upstream
        trace = self.trace
        with trace.muted():  # a refusal read whole must not count as the request's end
            if upstream.status == 400:
                content, upstream = await peek_body(upstream)
                text = content.decode("utf-8", "replace")
            elif upstream.status == 200 and trace.stream and is_event_stream(upstream):
                event, upstream = await peek_event(upstream, containing=b"error")
                text = event.data if event is not None and "error" in event.data else ""
            else:
                return None, upstream
        refusal = refusal_message(text)
        if refusal is not None:
            return refusal, upstream
        if trace.duration_s is not None:
            trace.notify()  # the answer ended while muted: the observers hear of it now
        return None, upstream

    def _learn(self, served: Upstream, named: dict[str, tuple[str, ...]]) -> None:
        """Learn the refusals of this request once another backend served it: a refusal
        the retry's backend repeats (a 400 every backend gives, as a grammar error quoting
        the client's own text) says nothing about speculation."""
        params, path = self.gateway.spec_params, self.kind.path
        if served.status != 200:
            logger.info(
                "%s answered %s %d after a refusal: nothing learnt",
                served.backend,
                path,
                served.status,
            )
            return
        for method, names in named.items():
            params.learn(method, path, names)
            logger.info(
                "%s speculation refuses %s on %s: learnt (%s served it)",
                method,
                list(names) or "unnamed parameters",
                path,
                served.backend,
            )

    async def _retry(
        self,
        upstream: Upstream,
        message: str,
        refused_methods: set[str],
        named: dict[str, tuple[str, ...]],
        open_on: Opener,
    ) -> Upstream | None:
        gateway, backends = self.gateway, self.gateway.config.backends
        method = backends[upstream.backend].spec.method or ""
        learnt = named[method] = gateway.spec_params.named(self.body, message)
        gateway.spec_params.refusals += 1
        refused_methods.add(method)
        logger.info(
            "%s (%s) refused %s for speculative decoding (names %s); routing again",
            upstream.backend,
            method,
            self.kind.path,
            list(learnt) or "nothing",
        )
        # This request goes plain first: every speculation method is passed over (other
        # methods stay last-resort failover targets); what was learnt stays per method.
        refused = dict(self.features.spec_refused)
        refused.update(
            gateway.spec_params.refused(self.body, gateway.derived().spec_methods, self.kind.path)
        )
        for name in gateway.derived().spec_methods:
            refused.setdefault(name, learnt or (UNNAMED,))
        features = dataclasses.replace(self.features, spec_refused=refused)
        decision = gateway.policy.decide(features, gateway.registry.snapshot(), gateway.rng)
        order = tuple(
            name
            for name in decision.backends
            if (backends[name].spec.method or "") not in refused_methods
        )
        if not order:
            return None
        with self.trace.muted():
            await upstream.aclose()
        self.trace.discard()
        self.features = features
        return await open_on(order, self.make_tap())

    async def _remember(self, upstream: Upstream, affinity: ResponseAffinity) -> Upstream:
        if self.trace.stream and is_event_stream(upstream):
            event, upstream = await peek_event(upstream)
            rid = response_id(event.data) if event is not None else None
        elif not self.trace.stream:
            content, upstream = await peek_body(upstream)
            rid = response_id(content)
        else:
            return upstream
        if rid is not None:
            affinity.remember(rid, upstream.backend)
        return upstream
