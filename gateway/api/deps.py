"""FastAPI dependencies: the app's long-lived objects, reached through ``request.app.state``."""

from __future__ import annotations

from typing import Annotated

import httpx
from fastapi import Depends, Request

from gateway.service import Gateway
from gateway.settings import Settings
from gateway.upstream.forward import Forwarder


async def get_gateway(request: Request) -> Gateway:
    """The :class:`Gateway` built by the lifespan."""
    return request.app.state.gateway  # type: ignore[no-any-return]


async def get_client(request: Request) -> httpx.AsyncClient:
    """The shared upstream ``httpx.AsyncClient`` built by the lifespan."""
    return request.app.state.client  # type: ignore[no-any-return]


async def get_forwarder(request: Request) -> Forwarder:
    """The app's :class:`~gateway.upstream.forward.Forwarder` (upstream client + limits)."""
    return request.app.state.forwarder  # type: ignore[no-any-return]


async def get_settings(request: Request) -> Settings:
    """The process :class:`Settings` the app was created with."""
    return request.app.state.settings  # type: ignore[no-any-return]


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
ClientDep = Annotated[httpx.AsyncClient, Depends(get_client)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ForwarderDep = Annotated[Forwarder, Depends(get_forwarder)]
