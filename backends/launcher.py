"""Run local vLLM servers as child processes (CLI-time, blocking code).

Each :class:`LocalBackend` runs one ``python -m vllm.entrypoints.openai.api_server ...`` in a
session (and process group) of its own, its output going to a log file; stopping takes the
whole process tree down (:class:`backends.process.ChildProcess`, shared with the benchmarks).
:class:`LocalStack` starts several, waits for all to be healthy in parallel and stops them all
on exit, error or Ctrl-C.
"""

from __future__ import annotations

import atexit
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from types import TracebackType

import httpx

from backends.process import ChildProcess
from contracts.launch_profile import BackendProfile, build_argv

#: Niceness added to every local vLLM server: when the gateway (at the default priority)
#: wants a CPU that busy servers share with it, it gets it first, so its own /health and
#: relaying are not starved (issue 26: the gateway's /health took 5.5 s with four CPU
#: servers decoding on two cores). A server alone on its CPUs runs as fast as before.
BACKEND_NICENESS = 10

LogFn = Callable[[str], None]


class BackendError(RuntimeError):
    """A local backend failed to start, exited early or did not become healthy in time."""

    def __init__(self, name: str, message: str, log_tail: str = "") -> None:
        self.name, self.log_tail = name, log_tail
        shown = "\n".join(f"  | {line}" for line in log_tail.splitlines())
        super().__init__(f"[{name}] {message}" + (f"\nlast log lines:\n{shown}" if shown else ""))


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class LocalBackend:
    """One local server process: ``start()``, ``wait_healthy()``, ``stop()``.

    ``python`` is the vLLM venv's interpreter; ``argv`` overrides the command (tests use a fake
    server); the profile still gives the URL and extra environment. The process itself is a
    :class:`~backends.process.ChildProcess`. Not reusable after stop().
    """

    def __init__(
        self,
        name: str,
        profile: BackendProfile,
        python: str | Path,
        log_path: Path,
        *,
        argv: Sequence[str] | None = None,
    ) -> None:
        self.name, self.profile, self.log_path = name, profile, log_path
        self.argv = list(argv) if argv is not None else build_argv(profile, str(python))
        self._process = ChildProcess(
            self.argv,
            log_path,
            header=f"# specgate: {shlex.join(self.argv)}\n",
            niceness=BACKEND_NICENESS,
        )
        self._stopping = threading.Event()
        self._lock = threading.RLock()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8101``."""
        return self.profile.url

    @property
    def pid(self) -> int | None:
        """The server's pid (also its process group id), None before start()."""
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The server's exit code once it has exited, else None (also before start())."""
        return self._process.returncode

    def respawn(self) -> LocalBackend:
        """A fresh, unstarted backend with the same name, profile, command and log path
        (for a restart: this one is not reusable); the old log is kept as ``NAME.log.1``."""
        if self.log_path.exists():
            self.log_path.replace(self.log_path.with_name(self.log_path.name + ".1"))
        return LocalBackend(self.name, self.profile, "", self.log_path, argv=self.argv)

    def interrupt(self) -> None:
        """Make a :meth:`wait_healthy` in progress give up (the process is left running)."""
        self._stopping.set()

    def start(self) -> None:
        """Spawn the server with ``os.environ | profile.launch_env``, output to :attr:`log_path`.

        Raises BackendError if already started or the port already answers (another server
        there would pass our health checks), OSError if the program cannot be run.
        """
        if self._process.started:
            raise BackendError(self.name, "already started")
        if _port_open(httpx.URL(self.url).host, self.profile.port):
            raise BackendError(self.name, f"port {self.profile.port} is already in use")
        self._process.env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.profile.launch_env}
        self._process.start()
        atexit.register(self.stop)

    def log_tail(self, lines: int = 30, max_bytes: int = 16384) -> str:
        """The last ``lines`` lines of the log file, read from its last ``max_bytes`` bytes
        ('' if unreadable)."""
        return self._process.log_tail(lines, max_bytes)

    def wait_healthy(
        self,
        timeout_s: float,
        *,
        on_progress: Callable[[float], None] | None = None,
        progress_every_s: float = 15.0,
        interval_s: float = 0.5,
    ) -> float:
        """Poll ``GET {url}/health`` until it answers 200; return the seconds since the call.

        ``on_progress(elapsed_s)`` is called about every ``progress_every_s`` while waiting.
        Raises BackendError (with the log tail) if the process exits, stop() is called, or
        ``timeout_s`` passes.
        """
        if not self._process.started:
            raise BackendError(self.name, "not started")
        started, next_progress = time.monotonic(), progress_every_s
        with httpx.Client(timeout=httpx.Timeout(2.0, connect=1.0)) as client:
            while True:
                if self._stopping.is_set():
                    raise BackendError(self.name, "stopped before becoming healthy")
                code = self._process.returncode
                if code is not None:
                    msg = f"exited with code {code} before becoming healthy"
                    raise BackendError(self.name, msg, self.log_tail())
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return time.monotonic() - started
                except httpx.HTTPError:
                    pass
                elapsed = time.monotonic() - started
                if elapsed >= timeout_s:
                    msg = f"not healthy after {timeout_s:.0f} s"
                    raise BackendError(self.name, msg, self.log_tail())
                if on_progress is not None and elapsed >= next_progress:
                    on_progress(elapsed)
                    next_progress += progress_every_s
                self._stopping.wait(interval_s)

    def terminate(self) -> None:
        """Send SIGTERM (once) to the server's group and its descendants; do not wait."""
        with self._lock:
            self._stopping.set()
            self._process.terminate()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server and every process it started; idempotent, safe before start().

        SIGTERM to the group (and descendants that left it), up to ``timeout_s`` for all to
        exit, then SIGKILL to whatever is left (:meth:`ChildProcess.stop`). Stays registered
        with atexit until it has completed once.
        """
        with self._lock:
            self._stopping.set()
            self._process.stop(timeout_s)
            atexit.unregister(self.stop)


class LocalStack:
    """Context manager over several :class:`LocalBackend`: all start, all stop.

    ``with LocalStack(backends) as stack:`` starts every backend, waits for all to be healthy
    concurrently (lines like ``[ngram] healthy after 31.2 s`` go to ``log``) and stops them all
    when the block ends, raises or is interrupted; a failed start stops the others and raises
    BackendError. ``stack.healthy_after_s`` maps names to start-up seconds.
    """

    def __init__(
        self,
        backends: Sequence[LocalBackend],
        *,
        timeout_s: float = 300.0,
        log: LogFn = print,
    ) -> None:
        self.backends = list(backends)
        self.timeout_s = timeout_s
        self.log = log
        self.healthy_after_s: dict[str, float] = {}

    def start(self) -> dict[str, float]:
        """Start all and wait until all are healthy; return ``{name: seconds}``."""
        pool = ThreadPoolExecutor(max_workers=max(1, len(self.backends)))
        try:
            for backend in self.backends:
                backend.start()
                self.log(f"[{backend.name}] started pid {backend.pid} on {backend.url}")
            futures = {pool.submit(self._wait, backend): backend for backend in self.backends}
            for future in as_completed(futures):
                name, seconds = futures[future].name, future.result()
                self.healthy_after_s[name] = seconds
                self.log(f"[{name}] healthy after {seconds:.1f} s")
        except BaseException:
            self.stop()
            raise
        finally:
            pool.shutdown(wait=True)
        return dict(self.healthy_after_s)

    def _wait(self, backend: LocalBackend) -> float:
        def progress(elapsed: float) -> None:
            self.log(f"[{backend.name}] still starting ({elapsed:.0f} s, log {backend.log_path})")

        return backend.wait_healthy(self.timeout_s, on_progress=progress)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Signal all backends at once, then wait for (or kill) each."""
        for backend in self.backends:
            backend.terminate()
        for backend in self.backends:
            backend.stop(timeout_s)

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
