"""The gateway in N uvicorn worker processes: does taking a burst in more than one process
close what a relay costs at c=64? An experiment, not a way to deploy specgate.

    SPECGATE_CONFIG=config/gpu-twin.yaml SPECGATE_PORT=8033 \\
        python -m bench.gateway_workers --workers 4

One listening socket, uvicorn's ``workers`` (the kernel hands each new connection to one
process); each worker builds the app as ``specgate serve`` does (:func:`app`: settings from
``SPECGATE_*``, the config from ``SPECGATE_CONFIG``, the GC frozen and tuned alike). Each
worker routes on its own view: its own in-flight counts and learnt speeds, with the
backends' scraped batch (``/metrics``) the only load all of them see; its own health
checks, canary and state file (run it with ``SPECGATE_STATE_PERSIST=false``, else the
workers write one file in turn). ``/routes`` shows whichever worker took the connection.
docs/benchmarks.md section 7 ("Tenth run") has what it measured on the GPU twin.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from fastapi import FastAPI


def app() -> FastAPI:
    """One worker's gateway (uvicorn's factory, called in each worker process), as
    :func:`cli.serve.run_gateway` builds it. Raises
    :class:`~contracts.config.ConfigError` for an invalid config."""
    from cli.serve import basic_logging, set_log_levels, settle_heap
    from gateway.app import create_app
    from gateway.settings import Settings

    basic_logging()  # as cli.main.main
    settings = Settings()
    set_log_levels(settings)
    built = create_app(settings, config=settings.load_config())
    settle_heap()
    return built


def main(argv: Sequence[str] | None = None) -> None:
    """Serve :func:`app` in ``--workers`` processes on ``SPECGATE_HOST``/``SPECGATE_PORT``
    until interrupted."""
    import uvicorn

    from gateway.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    settings = Settings()
    uvicorn.run(
        "bench.gateway_workers:app",
        factory=True,
        workers=args.workers,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
        loop="uvloop",
        http="httptools",
        access_log=False,
    )


if __name__ == "__main__":
    main()
