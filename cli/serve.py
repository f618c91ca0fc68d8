"""``specgate serve``: the gateway in the foreground under uvicorn (also what ``up`` ends in)."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

from contracts.config import GatewayConfig
from gateway.settings import Settings

#: The loggers ``SPECGATE_LOG_LEVEL`` sets: the gateway's modules, its ``specgate.*`` lines
#: (access, decision) and the config's; at ``debug`` every other logger stays at info.
OWN_LOGGERS = ("gateway", "specgate", "contracts")


def run_gateway(
    settings: Settings,
    config: GatewayConfig,
    processes: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Run the gateway in the foreground with uvicorn until SIGINT/SIGTERM.

    On SIGTERM uvicorn stops accepting connections and lets requests in flight (streams
    included) finish for up to ``shutdown_grace_s`` seconds before closing them.
    Raises :class:`~gateway.auth.InsecureSettings` for an unsafe listener. ``processes``:
    the supervisor's view of the local backends (``specgate up``).
    """
    import uvicorn

    from gateway.app import create_app

    set_log_levels(settings)
    app = create_app(settings, config=config, processes=processes)
    settle_heap()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=logging.getLogger().level,  # uvicorn is a library: info at debug
        # uvicorn hints int, but hands the value to asyncio.wait_for: seconds as a float work.
        timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
        # uvloop and httptools (both from uvicorn[standard]) named, not left to "auto", so a
        # missing one fails loudly instead of silently halving throughput; uvicorn's own
        # access log off: specgate.access already logs one richer line per request.
        loop="uvloop",
        http="httptools",
        access_log=False,
    )


def basic_logging() -> None:
    """Every process's log format (time, level, logger: message) at info, httpx's at warning
    (else one line per health poll)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def set_log_levels(settings: Settings) -> None:
    """The process's log levels from ``settings.log_level``, and the logging module's
    per-record lookups it never shows turned off (every request logs an access line)."""
    level = settings.log_level.upper()
    # debug is for specgate's own loggers (e.g. specgate.decision): the libraries stay at
    # info (httpcore alone logs a dozen DEBUG lines per health poll)
    logging.getLogger().setLevel("INFO" if level == "DEBUG" else level)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level)
    # No record field the log format shows needs the caller's frame, thread or process:
    # the logging HOWTO's "Optimization" switches, since every request logs an access line.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None


def settle_heap() -> None:
    """Freeze what is alive now out of the cyclic GC and raise its young threshold: call it
    once the app is built, before serving."""
    # Every object alive now (modules, config, classifier tables: ~110k) lives as long as
    # the process: frozen out of the cyclic GC, a full collection under load scans only
    # what requests allocate (measured: gen-2 pauses of 70-120 ms CPU with 400 requests in
    # flight, blocking the event loop; bench.health_load, docs/benchmarks.md).
    gc.freeze()
    # A request's objects die by reference counting when it ends, so a young generation
    # of 700 (the default) is collected every few requests only to scan what is still in
    # flight: 7% of the gateway's CPU at c=32, ~11% at 400 concurrent (gc.callbacks,
    # docs/benchmarks.md sections 1 and 6). At 10,000 a young collection waits for that
    # many more container objects alive (in flight, or garbage cycles): ~0% and ~4%, and
    # cyclic garbage is still collected.
    gc.set_threshold(10_000, 20, 100)
