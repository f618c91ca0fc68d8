"""Run specgate on another ASGI server, to measure the option before adopting it.

    python -m bench.variants --config FILE --port P [--server uvicorn|granian]

Used by ``python -m bench.overhead --specgate-variant LABEL:server=granian`` through
``bench.targets.specgate_target``. ``--server granian`` serves the same app with granian's
embedded ASGI server (Rust HTTP) instead of uvicorn (measured and rejected in
docs/benchmarks.md; granian is no dependency of specgate: ``pip install granian`` first).
Settings (``SPECGATE_*``) are varied without this module, as
environment items of ``--specgate-variant``.

Not a way to run specgate in production: ``specgate serve`` is.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from cli.serve import run_gateway
from contracts.config import load_config
from gateway.app import create_app
from gateway.settings import Settings


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the flags, build the app and serve it until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server", choices=["uvicorn", "granian"], default="uvicorn")
    args = parser.parse_args(argv)
    settings = Settings(config=args.config, port=args.port)
    if args.server == "uvicorn":
        run_gateway(settings, load_config(args.config))  # what ``specgate serve`` runs
        return
    import uvloop
    from granian.constants import Interfaces
    from granian.server.embed import Server

    app = create_app(settings, config=load_config(args.config))
    server = Server(app, address=settings.host, port=settings.port, interface=Interfaces.ASGI)
    uvloop.run(server.serve())


if __name__ == "__main__":
    main()
