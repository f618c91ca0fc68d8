"""The gateway's in-flight slot (issue 14, item 1): taken and given back by a context
manager, whatever happens inside, with no trace observer involved."""

from __future__ import annotations

import pytest

from gateway.errors import GatewayError
from gateway.service import Gateway
from tests.unit.conftest import MODEL, InProcess, local_config


def test_a_slot_is_given_back_on_error_and_refused_when_full() -> None:
    gateway = Gateway(local_config())
    with pytest.raises(ValueError), gateway.admission(1):
        assert gateway.inflight == 1
        raise ValueError("a bug in the request's handling")
    assert gateway.inflight == 0
    with gateway.admission(1):
        with pytest.raises(GatewayError) as info, gateway.admission(1):
            pass
        assert info.value.status == 429 and gateway.inflight == 1
    assert gateway.inflight == 0


async def test_the_slot_does_not_wait_for_the_trace(gw: InProcess) -> None:
    gateway = gw.app.state.runtime.gateway
    gateway.observers.clear()  # no observer at all: the slot is still given back
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    for extra in ({}, {"stream": True}, {"model": "nope"}):
        await gw.client.post("/v1/completions", json=body | extra)
        assert gateway.inflight == 0
    await gw.client.post("/v1/completions", content=b"{not json")
    assert gateway.inflight == 0
