"""Run local vLLM servers as child processes (CLI-time, blocking code).

Each :class:`LocalBackend` runs one ``python -m vllm.entrypoints.openai.api_server ...`` in a
session (and process group) of its own, its output going to a log file. vLLM starts EngineCore
and worker children, so stopping signals the whole group (SIGTERM, then SIGKILL) plus any
descendant that left it, and waits until none is left. :class:`LocalStack` starts several,
waits for all to be healthy in parallel and stops them all on exit, error or Ctrl-C.
Process bookkeeping reads Linux ``/proc``; elsewhere the group is signalled but only the
server itself is waited for.
"""

from __future__ import annotations

import atexit
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from types import TracebackType

import httpx

from contracts.launch_profile import BackendProfile, build_argv

LogFn = Callable[[str], None]
#: (pid, start time in clock ticks): identifies a process even if its pid is reused later.
ProcKey = tuple[int, int]


class BackendError(RuntimeError):
    """A local backend failed to start, exited early or did not become healthy in time."""

    def __init__(self, name: str, message: str, log_tail: str = "") -> None:
        self.name, self.log_tail = name, log_tail
        shown = "\n".join(f"  | {line}" for line in log_tail.splitlines())
        super().__init__(f"[{name}] {message}" + (f"\nlast log lines:\n{shown}" if shown else ""))


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """``{pid: (ppid, pgid, starttime)}`` of live processes from /proc ({} without it)."""
    table = {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        if fields[0] not in ("Z", "X"):  # zombies hold no resources; their parent reaps them
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return table


def _group(pgid: int) -> set[ProcKey]:
    """Live members of process group ``pgid``."""
    table = _proc_table()
    return {(pid, row[2]) for pid, row in table.items() if row[1] == pgid}


def _descendants(root: int) -> set[ProcKey]:
    """Live process ``root`` and its descendants; only valid while ``root`` is not reaped."""
    table = _proc_table()
    found = {root} if root in table else set()
    frontier = set(found)
    while frontier:
        frontier = {pid for pid, row in table.items() if row[0] in frontier} - found
        found |= frontier
    return {(pid, table[pid][2]) for pid in found}


def _alive(keys: set[ProcKey]) -> set[ProcKey]:
    table = _proc_table()
    return {(pid, start) for pid, start in keys if pid in table and table[pid][2] == start}


def _signal(pgid: int, keys: set[ProcKey], sig: signal.Signals) -> None:
    for send, target in [(os.killpg, pgid), *((os.kill, pid) for pid, _ in _alive(keys))]:
        try:
            send(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class LocalBackend:
    """One local server process: ``start()``, ``wait_healthy()``, ``stop()``.

    ``python`` is the vLLM venv's interpreter; ``argv`` overrides the command (tests use a fake
    server); the profile still gives the URL and extra environment. Not reusable after stop().
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
        self._proc: subprocess.Popen[bytes] | None = None
        self._keys: set[ProcKey] = set()  # processes signalled by terminate()
        self._terminated = False
        self._stopping = threading.Event()
        self._lock = threading.RLock()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8101``."""
        return self.profile.url

    @property
    def pid(self) -> int | None:
        """The server's pid (also its process group id), None before start()."""
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        """The server's exit code once it has exited, else None (also before start())."""
        return None if self._proc is None else self._proc.poll()

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
        if self._proc is not None:
            raise BackendError(self.name, "already started")
        if _port_open(httpx.URL(self.url).host, self.profile.port):
            raise BackendError(self.name, f"port {self.profile.port} is already in use")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.profile.launch_env}
        with self.log_path.open("wb") as log:
            log.write(f"# specgate: {shlex.join(self.argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        atexit.register(self.stop)

    def log_tail(self, lines: int = 30, max_bytes: int = 16384) -> str:
        """The last ``lines`` lines of the log file, read from its last ``max_bytes`` bytes
        ('' if unreadable)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

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
        if self._proc is None:
            raise BackendError(self.name, "not started")
        started, next_progress = time.monotonic(), progress_every_s
        with httpx.Client(timeout=httpx.Timeout(2.0, connect=1.0)) as client:
            while True:
                if self._stopping.is_set():
                    raise BackendError(self.name, "stopped before becoming healthy")
                code = self._proc.poll()
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

    def _snapshot(self, proc: subprocess.Popen[bytes]) -> set[ProcKey]:
        """The server's group plus, while the server is unreaped, all its descendants."""
        keys = _group(proc.pid)
        return keys | _descendants(proc.pid) if proc.poll() is None else keys

    def terminate(self) -> None:
        """Send SIGTERM (once) to the server's group and its descendants; do not wait."""
        with self._lock:
            self._stopping.set()
            if self._proc is None or self._terminated:
                return
            self._terminated = True
            self._keys = self._snapshot(self._proc)
            _signal(self._proc.pid, self._keys, signal.SIGTERM)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server and every process it started; idempotent, safe before start().

        SIGTERM to the group (and descendants that left it), up to ``timeout_s`` for all to
        exit, then SIGKILL to whatever is left. Returns once none of them is alive (a process
        in uninterruptible sleep could delay that by up to 5 more seconds). Stays registered
        with atexit until it has completed once.
        """
        with self._lock:
            self.terminate()
            if self._proc is not None:
                self._wait_or_kill(self._proc, timeout_s)
            atexit.unregister(self.stop)

    def _wait_or_kill(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        keys, pgid = self._keys, proc.pid
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _alive(keys) and not _group(pgid):
                return
            time.sleep(0.05)
        keys |= _group(pgid)
        _signal(pgid, keys, signal.SIGKILL)
        proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while (_alive(keys) or _group(pgid)) and time.monotonic() < deadline:
            time.sleep(0.05)


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
