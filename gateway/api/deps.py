"""FastAPI dependencies: the app's long-lived objects, from its typed
:class:`~gateway.runtime.Runtime`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.runtime import Runtime, runtime_of
from gateway.service import Gateway
from gateway.settings import Settings


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
