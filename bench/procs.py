"""Child processes for benchmarks: start them (``backends.process``, the launcher's own
supervision), wait until they answer, measure their CPU time from ``/proc`` (summed over the
process tree), stop them and every descendant.

Linux only (``/proc``); benchmarks are run on the project's Linux machines.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from backends import process

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


#: Ports :func:`free_port` picks from: below Linux's default ephemeral range (32768-60999,
#: ``net.ipv4.ip_local_port_range``), where the kernel puts outgoing connections' own ports.
#: A port from the ephemeral range itself (binding port 0) was taken by such a connection
#: between the check and the server's bind on a host whose gateway held hundreds of them
#: (bench.sim_fleet on the GPU host, docs/benchmarks.md section 7, session 14).
PORT_RANGE = (20000, 32767)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range
    (:data:`PORT_RANGE`); random, so concurrent callers rarely pick the same one.

    Raises OSError when 200 random ports of the range were all taken."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(*PORT_RANGE)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {PORT_RANGE[0]}-{PORT_RANGE[1]}")


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """``root`` and every live descendant (by parent pid, from /proc)."""
    return sorted(pid for pid, _ in process.descendants(root))


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and its live descendants (all their threads)."""
    ticks = 0
    for pid in descendants(root):
        fields = _stat(pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return ticks / CLOCK_TICKS


def mapped_libraries(root: int, names: Sequence[str]) -> list[str]:
    """Which of ``names`` (substrings of shared-object paths) the process tree has loaded,
    e.g. ``["uvloop", "httptools"]``: shows which event loop and HTTP parser a server uses."""
    seen: set[str] = set()
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
        except OSError:
            continue
        seen |= {name for name in names if f"/{name}" in maps}
    return sorted(seen)


def machine() -> dict[str, Any]:
    """CPU model, cores, memory, Python: where the figures were measured."""
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = int(open("/proc/meminfo").readline().split()[1])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def interrupt_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, ``kill``) raise KeyboardInterrupt like Ctrl-C, so ``with``
    blocks stop every server a benchmark started instead of leaving them running."""

    def _raise(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _raise)


def load_average() -> float:
    """The 1-minute load average: above the core count, other work shares the CPUs and the
    figures of a run are noisier (CPU time per request rises with cache contention)."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Server:
    """A benchmarked server process: ``with Server(...) as s:`` starts it, waits until
    ``ready_url`` answers 2xx, and stops the whole tree on exit (the process itself is a
    :class:`backends.process.ChildProcess`, as ``specgate up``'s servers are).

    ``cpus`` pins the process (and so its children) to those CPUs; ``niceness`` lowers its
    priority (as ``specgate up`` lowers its backends').
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready_url: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cpus: set[int] | None = None,
        startup_timeout_s: float = 120.0,
        niceness: int = 0,
    ) -> None:
        self.name, self.argv, self.ready_url = name, list(argv), ready_url
        self.log_path, self.env, self.cpus = log_path, env, cpus
        self.startup_timeout_s = startup_timeout_s
        self.niceness = niceness
        self.process: process.ChildProcess | None = None

    @property
    def pid(self) -> int:
        """The server's pid (also its process group id)."""
        assert self.process is not None and self.process.pid is not None, "not started"
        return self.process.pid

    def start(self) -> None:
        """Spawn the server and wait until it is ready; raises RuntimeError with its log."""
        env = {**os.environ, **(self.env or {})}
        self.process = process.ChildProcess(
            self.argv, self.log_path, env=env, cpus=self.cpus, niceness=self.niceness
        )
        self.process.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.returncode is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_tail()}")
            try:
                if httpx.get(self.ready_url, timeout=1.0).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(
            f"{self.name} not ready in {self.startup_timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the server's log."""
        return self.process.log_tail(lines) if self.process is not None else ""

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the server's process tree."""
        return cpu_seconds(self.pid)

    def stop(self) -> None:
        """SIGTERM the group and every descendant, SIGKILL after 10 s, wait until all are gone."""
        if self.process is not None:
            self.process.stop(timeout_s=10.0)

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
