"""FastAPI dependencies: the app's long-lived objects, reached through ``request.app.state``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.service import Gateway
from gateway.settings import Settings


async def get_gateway(request: Request) -> Gateway:
    """The :class:`Gateway` built by the lifespan."""
    return request.app.state.gateway  # type: ignore[no-any-return]


async def get_settings(request: Request) -> Settings:
    """The process :class:`Settings` the app was created with."""
    return request.app.state.settings  # type: ignore[no-any-return]


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
