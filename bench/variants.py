"""Run specgate with hot-path experiments, to measure options before adopting them.

    python -m bench.variants --config FILE --port P [--client httpx|aiohttp]
        [--server uvicorn|granian] [--async-deps] [--no-access-log] [--lean]

Used by ``python -m bench.overhead --specgate-variant LABEL:...`` through
``SPECGATE_BENCH_VARIANT`` (e.g. ``client=aiohttp,server=granian,async-deps``). Each flag
changes one thing against ``specgate serve``:

* ``--client aiohttp``: the shared ``httpx.AsyncClient`` on ``httpx_aiohttp.AiohttpTransport``
  (aiohttp's C parser and connection pool under httpx's API);
* ``--server granian``: granian's embedded ASGI server (Rust HTTP) instead of uvicorn;
* ``--async-deps``: the FastAPI dependencies that fetch app state as ``async def`` (sync
  ones run in a worker thread per call);
* ``--no-access-log``: uvicorn's per-request access log off;
* ``--lean``: :class:`bench.lean.LeanProxy` serves the two proxy endpoints (raw ASGI,
  aiohttp directly, same routing and trace): an upper bound of a hot-path rewrite.

Not a way to run specgate in production: ``specgate serve`` is.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import httpx
from starlette.requests import Request

from gateway.config import load_config
from gateway.settings import Settings


def aiohttp_transport(settings: Settings) -> httpx.AsyncBaseTransport:
    """httpx-aiohttp's transport with the gateway's connection limit."""
    from httpx_aiohttp import AiohttpTransport

    limits = httpx.Limits(
        max_connections=settings.max_connections,
        max_keepalive_connections=settings.max_connections,
    )
    return AiohttpTransport(limits=limits)


def use_async_deps() -> list[str]:
    """Replace the sync app-state dependencies of ``gateway.api.deps`` (and the ``Annotated``
    aliases built from them) with ``async def`` twins that do the same. Must run before the
    routers are imported; returns the names replaced."""
    from fastapi import Depends

    from gateway.api import deps

    swapped = []
    for alias, value in list(vars(deps).items()):
        metadata = getattr(value, "__metadata__", None)
        if not alias.endswith("Dep") or not metadata:
            continue
        call = metadata[0].dependency
        if inspect.iscoroutinefunction(call):
            continue
        twin = _async_twin(call)
        setattr(deps, call.__name__, twin)
        setattr(deps, alias, Annotated[value.__origin__, Depends(twin)])
        swapped.append(call.__name__)
    return swapped


def _async_twin(call: Callable[[Any], Any]) -> Callable[[Any], Any]:
    async def twin(request: Request) -> Any:
        return call(request)

    twin.__name__ = call.__name__
    return twin


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the flags, build the app and serve it until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client", choices=["httpx", "aiohttp"], default="httpx")
    parser.add_argument("--server", choices=["uvicorn", "granian"], default="uvicorn")
    parser.add_argument("--async-deps", action="store_true")
    parser.add_argument("--no-access-log", action="store_true")
    parser.add_argument("--lean", action="store_true", help="bench.lean's raw ASGI hot path")
    args = parser.parse_args(argv)
    if args.async_deps:
        print(f"bench.variants: async dependencies: {use_async_deps()}", flush=True)
    from gateway.app import create_app

    settings = Settings(config=args.config, port=args.port)
    transport = aiohttp_transport(settings) if args.client == "aiohttp" else None
    app: Any = create_app(settings, config=load_config(args.config), transport=transport)
    if args.lean:
        from bench.lean import LeanProxy

        app = LeanProxy(app)
    if args.server == "granian":
        import uvloop
        from granian.constants import Interfaces
        from granian.server.embed import Server

        server = Server(
            app,
            address=settings.host,
            port=settings.port,
            interface=Interfaces.ASGI,
            log_access=not args.no_access_log,
        )
        uvloop.run(server.serve())
        return
    import uvicorn

    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        loop="uvloop",
        http="httptools",
        access_log=not args.no_access_log,
    )


if __name__ == "__main__":
    main()
