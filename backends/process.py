"""A child process in a session of its own, stopped together with everything it started.

The one process supervision of the project: :class:`~backends.launcher.LocalBackend`
(``specgate up``, the drafts gate) and ``bench.procs.Server`` (benchmarks) both run their
servers through :class:`ChildProcess`. vLLM starts EngineCore and worker children, so
stopping signals the whole process group (SIGTERM, then SIGKILL) plus any descendant that
left it, and waits until none is left. Process bookkeeping reads Linux ``/proc``; elsewhere
the group is signalled but only the process itself is waited for. CLI-time, blocking code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

#: (pid, start time in clock ticks): identifies a process even if its pid is reused later.
ProcKey = tuple[int, int]


def proc_table() -> dict[int, tuple[int, int, int]]:
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


def group(pgid: int) -> set[ProcKey]:
    """Live members of process group ``pgid``."""
    table = proc_table()
    return {(pid, row[2]) for pid, row in table.items() if row[1] == pgid}


def descendants(root: int) -> set[ProcKey]:
    """Live process ``root`` and its descendants; only valid while ``root`` is not reaped."""
    table = proc_table()
    found = {root} if root in table else set()
    frontier = set(found)
    while frontier:
        frontier = {pid for pid, row in table.items() if row[0] in frontier} - found
        found |= frontier
    return {(pid, table[pid][2]) for pid in found}


def alive(keys: set[ProcKey]) -> set[ProcKey]:
    """The processes of ``keys`` still running (same pid and start time)."""
    table = proc_table()
    return {(pid, start) for pid, start in keys if pid in table and table[pid][2] == start}


def signal_tree(pgid: int, keys: set[ProcKey], sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pgid`` and to every process of ``keys`` still alive."""
    for send, target in [(os.killpg, pgid), *((os.kill, pid) for pid, _ in alive(keys))]:
        try:
            send(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


class ChildProcess:
    """``argv`` run in a new session, stdin closed, stdout and stderr to ``log_path``.

    ``env`` is the whole environment (None: this process's); ``header`` is written to the log
    first; ``cpus`` pins the process (and so its children) to those CPUs; ``niceness`` is
    added to its scheduling niceness (``nice(2)``: a positive value yields the CPU to
    processes at the default priority when they want it). Not reusable after :meth:`stop`.
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        header: str = "",
        cpus: set[int] | None = None,
        niceness: int = 0,
    ) -> None:
        self.argv, self.log_path, self.env = list(argv), log_path, env
        self.header, self.cpus, self.niceness = header, cpus, niceness
        self._proc: subprocess.Popen[bytes] | None = None
        self._keys: set[ProcKey] = set()  # processes signalled by terminate()
        self._terminated = False
        self._lock = threading.RLock()

    @property
    def started(self) -> bool:
        """True once :meth:`start` has spawned the process."""
        return self._proc is not None

    @property
    def pid(self) -> int | None:
        """The process's pid (also its process group id), None before start()."""
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has exited, else None (also before start())."""
        return None if self._proc is None else self._proc.poll()

    def start(self) -> None:
        """Spawn the process; OSError if the program cannot be run."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cpus, niceness = self.cpus, self.niceness

        def child_setup() -> None:  # in the child, before exec
            if cpus:
                os.sched_setaffinity(0, cpus)
            if niceness:
                os.nice(niceness)

        with self.log_path.open("wb") as log:
            if self.header:
                log.write(self.header.encode())
                log.flush()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(self.env) if self.env is not None else None,
                start_new_session=True,
                preexec_fn=child_setup if cpus or niceness else None,  # noqa: PLW1509
            )

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

    def _snapshot(self, proc: subprocess.Popen[bytes]) -> set[ProcKey]:
        """The process's group plus, while it is unreaped, all its descendants."""
        keys = group(proc.pid)
        return keys | descendants(proc.pid) if proc.poll() is None else keys

    def terminate(self) -> None:
        """Send SIGTERM (once) to the process's group and its descendants; do not wait."""
        with self._lock:
            if self._proc is None or self._terminated:
                return
            self._terminated = True
            self._keys = self._snapshot(self._proc)
            signal_tree(self._proc.pid, self._keys, signal.SIGTERM)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the process and every process it started; idempotent, safe before start().

        SIGTERM to the group (and descendants that left it), up to ``timeout_s`` for all to
        exit, then SIGKILL to whatever is left. Returns once none of them is alive (a process
        in uninterruptible sleep could delay that by up to 5 more seconds).
        """
        with self._lock:
            self.terminate()
            if self._proc is not None:
                self._wait_or_kill(self._proc, timeout_s)

    def _wait_or_kill(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        keys, pgid = self._keys, proc.pid
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not alive(keys) and not group(pgid):
                return
            time.sleep(0.05)
        keys |= group(pgid)
        signal_tree(pgid, keys, signal.SIGKILL)
        proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while (alive(keys) or group(pgid)) and time.monotonic() < deadline:
            time.sleep(0.05)
