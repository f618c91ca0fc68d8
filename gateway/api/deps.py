"""FastAPI dependencies: the app's long-lived objects, from its typed
:class:`~gateway.runtime.Runtime`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, Request

from gateway.runtime import Runtime, runtime_of
from gateway.service import Gateway
from gateway.settings import Settings
from gateway.trace import request_id_of


async def get_runtime(request: Request) -> Runtime:
    """The :class:`Runtime` the lifespan opened."""
    return runtime_of(request.app)


async def get_gateway(request: Request) -> Gateway:
    """The :class:`Gateway` built by the lifespan."""
    return runtime_of(request.app).gateway


async def get_settings(request: Request) -> Settings:
    """The process :class:`Settings` the app was created with."""
    return runtime_of(request.app).settings


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
GatewayDep = Annotated[Gateway, Depends(get_gateway)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def with_request_id(request: Request, headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """``headers`` with ``x-request-id`` where they lack it (a relayed request's error has
    the one its backend was sent): the client's (its bytes echoed), else a new one, as the
    gateway's relayed answers carry it (the OpenAI SDK reads it into its errors'
    ``request_id``)."""
    return {"x-request-id": request_id_of(request.headers.get("x-request-id")), **(headers or {})}
