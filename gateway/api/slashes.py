"""Trailing slashes, as vLLM's server answers them: a 307 to the canonical path.

vLLM's OpenAI server is a FastAPI app with Starlette's ``redirect_slashes``: a path that
matches no route but would without its trailing slash (``POST /v1/chat/completions/``) is
answered ``307 Temporary Redirect`` to that path, query string kept (the OpenAI SDK and
httpx clients follow it, re-sending the body). The gateway's catch-all relay route
(``/{path:path}``) matches every path, so Starlette's own redirect never runs; this does
the same before routing, for every path the gateway serves: its routed endpoints, its own
routes (health, admin, ...) and the backend paths it relays.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import URL
from starlette.responses import RedirectResponse
from starlette.routing import Match

from gateway.api.passthrough import listed
from gateway.upstream.endpoints import is_client_path


async def _relayed(app: Any, path: str) -> bool:
    """Whether a backend lists ``path`` as a client path the relay serves."""
    runtime = getattr(app.state, "runtime", None)
    if runtime is None:
        return False
    found = await listed(runtime, path)
    return found is not None and is_client_path(found.template)


async def redirect_slash(app: Any, scope: dict[str, Any], receive: Any, send: Any) -> bool:
    """Answer a 307 to ``scope``'s path without its trailing slash when that path is served
    and the path as given is not relayed to a backend listing it (``app``: the gateway's
    :class:`~gateway.app.SpecgateApp`, whose ``catch_all`` is the relay's route). Returns
    whether it answered; only paths ending in ``/`` (other than ``/``) are looked at.

    The gateway's own routes end in no slash, so only the relay can serve such a path as
    given; ``/routes/backends/{backend}/{path}/`` is redirected too (relayed, the backend's
    own 307 would name its address)."""
    path = scope["path"]
    canonical = {**scope, "path": path.rstrip("/")}
    if scope["type"] != "http" or not canonical["path"] or canonical["path"] == path:
        return False
    catch_all = getattr(app, "catch_all", None)  # the relay's route
    # one of the gateway's own routes takes it (any method: Starlette redirects a partial match)
    own = any(r is not catch_all and r.matches(canonical)[0] is not Match.NONE for r in app.routes)
    if not own and (await _relayed(app, path) or not await _relayed(app, canonical["path"])):
        return False
    await RedirectResponse(url=str(URL(scope=canonical)))(scope, receive, send)
    return True
