"""Instructions per routed request, counted by callgrind: a measure of a hot-path change
that a busy machine does not move.

    python -m bench.instructions [--requests 500] [--concurrency 32] [--stream]
                                 [--tree /path/to/other/checkout]

The routed endpoint is driven as a raw ASGI app in one process (the overhead benchmark's
config, :func:`bench.targets.specgate_config`; aiohttp to :mod:`bench.fake_upstream` in a
process of its own), under ``valgrind --tool=callgrind --instr-atstart=no``: 200 requests
warm it up, then counting is switched on (``callgrind_control -i on``) for ``requests``
requests at ``concurrency`` and the total ``Ir`` is divided by them. uvicorn's HTTP parsing
and the kernel are not counted, and instructions are not time (docs/benchmarks.md, section
1, session 12: cuts that removed 9% of the instructions saved 1-3% of the CPU time); two
runs of one tree agree within about 0.6%. ``--tree``: count another checkout (e.g. ``git
archive C | tar -x -C DIR``) with this venv. Needs valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.procs import Server, free_port
from bench.targets import PATH, request_body, specgate_config

WARM_UP = 200


async def _one(app: Any, body: bytes) -> int:
    """One routed request through ``app`` (raw ASGI); returns its status."""
    done, sent, status = asyncio.Event(), [False], [0]

    async def receive() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        elif not message.get("more_body"):
            done.set()

    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": PATH, "raw_path": PATH.encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}  # fmt: skip
    await app(scope, receive, send)
    done.set()
    return status[0]


def _handshake(tell: Path, text: str, wait_for: Path) -> None:
    """Write ``text`` to ``tell`` for the parent, then wait until it creates ``wait_for``."""
    tell.write_text(text)
    while not wait_for.exists():
        time.sleep(0.05)


async def _load(app: Any, args: argparse.Namespace, flag: Path) -> None:
    """Warm up, tell the parent (``flag``), wait for counting, run, tell it again."""
    import gc

    body = request_body(args.stream)
    async with app.router.lifespan_context(app):
        await asyncio.sleep(1.5)  # the first health probes
        for _ in range(WARM_UP):
            await _one(app, body)
        gc.freeze()  # as `specgate serve` does
        gc.set_threshold(10_000, 20, 100)
        await asyncio.to_thread(_handshake, flag, str(os.getpid()), flag.with_suffix(".go"))
        left, bad = [args.requests], [0]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                bad[0] += await _one(app, body) != 200

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        done, stop = flag.with_suffix(".done"), flag.with_suffix(".stop")
        await asyncio.to_thread(_handshake, done, str(bad[0]), stop)


def _child(args: argparse.Namespace) -> None:
    """The counted process: the app, its fake upstream, the load."""
    import logging

    import uvloop

    work = Path(args.child)
    ports = [free_port() for _ in range(3)]
    upstreams = [f"http://127.0.0.1:{p}" for p in ports]
    config = work / "specgate.yaml"
    config.write_text(yaml.safe_dump(specgate_config(upstreams), sort_keys=False))
    os.environ |= {"SPECGATE_CONFIG": str(config), "SPECGATE_STATE_FILE": str(work / "s.json")}
    logging.basicConfig(  # as `specgate serve` logs: one access line per request
        level=logging.INFO, filename=str(work / "gateway.log"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )  # fmt: skip
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    from gateway.app import create_app
    from gateway.settings import Settings

    settings = Settings()
    app = create_app(settings, config=settings.load_config())
    argv = [sys.executable, "-m", "bench.fake_upstream"]
    argv += [a for p in ports for a in ("--port", str(p))]
    fake = Server("fake", argv, ready_url=upstreams[0] + "/health", log_path=work / "fake.log")
    with fake:
        uvloop.run(_load(app, args, work / "flag"))


def count(requests: int, concurrency: int, stream: bool, tree: Path | None) -> float:
    """Instructions per request (see the module docstring); raises RuntimeError when the
    counted process fails or a request was not answered 200."""
    with tempfile.TemporaryDirectory(prefix="specgate-ir-") as tmp:
        work, out = Path(tmp), Path(tmp) / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out}", sys.executable, "-m", "bench.instructions",
                "--child", tmp, "--requests", str(requests),
                "--concurrency", str(concurrency), *(["--stream"] if stream else [])]  # fmt: skip
        env = dict(os.environ)
        if tree is not None:
            env |= {"PYTHONPATH": f"{tree}{os.pathsep}{Path.cwd()}", "PYTHONSAFEPATH": "1"}
        flag = work / "flag"
        with (work / "child.log").open("wb") as log:
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                for step, wait_for in (("on", flag), ("off", flag.with_suffix(".done"))):
                    while not wait_for.exists():
                        if child.poll() is not None:
                            raise RuntimeError((work / "child.log").read_text()[-2000:])
                        time.sleep(0.2)
                    control = ["callgrind_control", "-i", step, str(child.pid)]
                    subprocess.run(control, check=True, capture_output=True)
                    if step == "on":
                        flag.with_suffix(".go").touch()
                subprocess.run(["callgrind_control", "-d", str(child.pid)], check=True,
                               capture_output=True)  # fmt: skip
                flag.with_suffix(".stop").touch()
                child.wait(timeout=300)
            finally:
                if child.poll() is None:
                    child.kill()
        if flag.with_suffix(".done").read_text() != "0":
            raise RuntimeError("requests not answered 200")
        annotate = ["callgrind_annotate", f"{out}.1"]
        text = subprocess.run(annotate, check=True, capture_output=True, text=True).stdout
        total = next(line for line in text.splitlines() if "PROGRAM TOTALS" in line)
        return int(total.split()[0].replace(",", "")) / requests


def main(argv: Sequence[str] | None = None) -> int:
    """Print one count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--stream", action="store_true", help="streamed requests (64 events)")
    parser.add_argument("--tree", type=Path, help="another checkout, counted instead")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    per_request = count(args.requests, args.concurrency, args.stream, args.tree)
    print(f"{per_request / 1e6:.3f}M instructions per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
