"""Supervision of the local backends under ``specgate up`` (CLI-time, blocking code).

One thread per :class:`~backends.launcher.LocalBackend` of a started
:class:`~backends.launcher.LocalStack` watches its server: the process exiting, or ``/health``
failing for ``engine_dead_after_s`` while the process lives on (vLLM's engine died but the
API server stayed up: it answers 503), is a crash. The supervisor then stops what is left of
the server (its whole process group, as ``LocalBackend.stop`` does), keeps the crashed log's
tail, waits an exponential backoff and launches the same command again (a fresh
``LocalBackend`` from :meth:`~backends.launcher.LocalBackend.respawn`), until it is healthy.
More than ``max_restarts`` restarts within ``window_s`` and it gives up on that backend (the
gateway keeps routing around it). The gateway reads :meth:`Supervisor.view` for ``/routes``,
``/status`` and ``/metrics``; traffic goes to the other backends meanwhile, because the
gateway's health poller sees the backend down.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx

from backends.launcher import BackendError, LocalBackend, LocalStack, LogFn

#: Log lines and characters of a crashed server's log kept in memory; distinct error lines
#: kept from its last 64 KiB (the root cause often lies above the shutdown noise).
TAIL_LINES, TAIL_CHARS, ERROR_LINES = 40, 8000, 12
_ERROR = re.compile(r"\b\w*(?:Error|Exception)\b|Traceback|\bERROR\b")


def error_lines(text: str, keep: int = ERROR_LINES) -> list[str]:
    """The last ``keep`` distinct lines of ``text`` that name an error (each cut to 300
    characters), oldest first."""
    found = dict.fromkeys(line.strip()[:300] for line in text.splitlines() if _ERROR.search(line))
    return list(found)[-keep:]


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart: after ``backoff_s`` seconds, doubling per consecutive failed run
    (one that crashed before staying healthy ``stable_s``) up to ``max_backoff_s``; at most
    ``max_restarts`` within any ``window_s`` seconds (then the backend is given up)."""

    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    max_restarts: int = 5
    window_s: float = 600.0
    stable_s: float = 120.0

    def delay(self, consecutive_failures: int) -> float:
        """Seconds to wait before the next start, after ``consecutive_failures`` (>= 1)."""
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** max(0, consecutive_failures - 1))

    def allows(self, restarts: deque[float], now: float) -> bool:
        """Whether another restart fits the window (``restarts``: monotonic start times)."""
        while restarts and now - restarts[0] >= self.window_s:
            restarts.popleft()
        return len(restarts) < self.max_restarts


@dataclass
class ProcessState:
    """What the gateway shows of one supervised backend (wall-clock times are epoch s)."""

    name: str
    state: str = "running"  # running | backing_off | starting | given_up | stopped
    pid: int | None = None
    restarts: int = 0
    crashes: int = 0
    last_crash: dict[str, Any] | None = None
    next_start_at: float | None = None
    restart_times: deque[float] = field(default_factory=deque)
    failures: int = 0  # consecutive runs that crashed before stable_s

    def to_json(self) -> dict[str, Any]:
        """The view: state, pid, running, restarts, crashes, last crash (reason, exit code,
        when, log tail, error lines), seconds until the next start while backing off."""
        wait = None if self.next_start_at is None else max(0.0, self.next_start_at - time.time())
        return {
            "state": self.state,
            "pid": self.pid,
            "running": self.state == "running",
            "restarts": self.restarts,
            "crashes": self.crashes,
            "last_crash": self.last_crash,
            "next_start_in_s": None if wait is None else round(wait, 1),
        }


class Supervisor:
    """Restarts the crashed servers of ``stack`` (module docstring). Use as a context
    manager inside ``with stack:``; ``startup_timeout_s`` bounds each restart's wait for
    ``/health``; ``interval_s`` is the watch period; ``log`` gets one line per event.

    A live process whose ``/health`` answers non-200 (or refuses) for ``engine_dead_after_s``
    has a dead engine; one whose ``/health`` only times out is busy, not dead (vLLM answers
    it on the event loop that streams every token): it counts as hung only after
    ``hung_after_s`` (default six times ``engine_dead_after_s``) without an answer."""

    def __init__(
        self,
        stack: LocalStack,
        policy: RestartPolicy | None = None,
        *,
        startup_timeout_s: float = 300.0,
        engine_dead_after_s: float = 10.0,
        interval_s: float = 1.0,
        log: LogFn = print,
        hung_after_s: float | None = None,
    ) -> None:
        self.stack, self.policy = stack, policy or RestartPolicy()
        self.startup_timeout_s, self.engine_dead_after_s = startup_timeout_s, engine_dead_after_s
        self.hung_after_s = 6 * engine_dead_after_s if hung_after_s is None else hung_after_s
        self.interval_s, self.log = interval_s, log
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._states = {b.name: ProcessState(b.name, pid=b.pid) for b in stack.backends}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start one watcher thread per backend."""
        for index, backend in enumerate(self.stack.backends):
            thread = threading.Thread(
                target=self._supervise, args=(index,), name=f"supervise-{backend.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop watching (restarts under way are abandoned; the stack stops the servers)."""
        self._stopping.set()
        for backend in list(self.stack.backends):
            backend.interrupt()
        for thread in self._threads:
            thread.join(timeout=15)
        with self._lock:
            for state in self._states.values():
                state.state = "stopped"

    def view(self) -> dict[str, dict[str, Any]]:
        """Per backend name, :meth:`ProcessState.to_json` (safe from any thread)."""
        with self._lock:
            return {name: state.to_json() for name, state in self._states.items()}

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _set(self, name: str, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(self._states[name], key, value)

    def _supervise(self, index: int) -> None:
        name = self.stack.backends[index].name
        healthy_since: float | None = time.monotonic()  # the stack started it healthy
        while not self._stopping.is_set():
            backend = self.stack.backends[index]
            reason = self._watch(backend) if healthy_since is not None else None
            if self._stopping.is_set():
                return
            self._crashed(backend, reason or "did not become healthy", healthy_since)
            if not self._restart_allowed(name):
                return
            healthy_since = self._restart(index)

    def _watch(self, backend: LocalBackend) -> str | None:
        """Block until the server crashes (returns why) or supervision stops (None)."""
        last_ok = time.monotonic()
        with httpx.Client(timeout=httpx.Timeout(2.0, connect=1.0)) as client:
            while not self._stopping.wait(self.interval_s):
                code = backend.returncode
                if code is not None:
                    return f"process exited with code {code}"
                answered = True
                try:
                    ok = client.get(f"{backend.url}/health").status_code == 200
                except httpx.TimeoutException:
                    ok = answered = False  # busy: load, not death
                except httpx.HTTPError:
                    ok = False
                now = time.monotonic()
                if ok:
                    last_ok = now
                elif answered and now - last_ok >= self.engine_dead_after_s:
                    return f"/health failing for {now - last_ok:.0f} s (engine dead)"
                elif now - last_ok >= self.hung_after_s:
                    return f"/health not answering for {now - last_ok:.0f} s (hung)"
        return None

    def _crashed(self, backend: LocalBackend, reason: str, healthy_since: float | None) -> None:
        code = backend.returncode
        tail = backend.log_tail(TAIL_LINES)[-TAIL_CHARS:]
        errors = error_lines(backend.log_tail(2000, max_bytes=65536))
        backend.stop()  # what is left of it: EngineCore, workers
        stable = healthy_since is not None and time.monotonic() - healthy_since >= (
            self.policy.stable_s
        )
        self.log(f"[{backend.name}] crashed: {reason}; log {backend.log_path}")
        with self._lock:
            state = self._states[backend.name]
            state.crashes += 1
            state.failures = 1 if stable else state.failures + 1
            state.pid = None
            state.last_crash = {
                "reason": reason,
                "exit_code": code,
                "at": time.time(),
                "log_tail": tail,
                "errors": errors,
            }

    def _restart_allowed(self, name: str) -> bool:
        with self._lock:
            state = self._states[name]
            allowed = self.policy.allows(state.restart_times, time.monotonic())
            if not allowed:
                state.state = "given_up"
        if not allowed:
            self.log(
                f"[{name}] not restarted: {self.policy.max_restarts} restarts within "
                f"{self.policy.window_s:g} s; the gateway routes around it"
            )
        return allowed

    def _restart(self, index: int) -> float | None:
        """Back off, start the server again, wait until healthy; its healthy time or None."""
        old = self.stack.backends[index]
        with self._lock:
            state = self._states[old.name]
            delay = self.policy.delay(state.failures)
            state.state, state.next_start_at = "backing_off", time.time() + delay
        self.log(f"[{old.name}] restarting in {delay:g} s")
        if self._stopping.wait(delay):
            return None
        new = old.respawn()
        self.stack.backends[index] = new  # the stack stops whatever runs at exit
        with self._lock:
            state.restart_times.append(time.monotonic())
            state.restarts += 1
            state.state, state.next_start_at = "starting", None
        try:
            new.start()
            self._set(old.name, pid=new.pid)
            seconds = new.wait_healthy(self.startup_timeout_s)
        except (BackendError, OSError) as exc:
            self.log(f"[{old.name}] restart failed: {exc}")
            return None
        self._set(old.name, state="running")
        self.log(f"[{old.name}] restarted, healthy after {seconds:.1f} s (pid {new.pid})")
        return time.monotonic()
