"""The local launcher against a fake server process: health, early exit, no orphans."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from backends.launcher import BackendError, LocalBackend, LocalStack
from contracts.launch_profile import BackendProfile

# argv: MODE PORT PIDFILE. Serves /health (200, or 503 while "warming up"/"never"), and in some
# modes first starts a grandchild and writes its pid to PIDFILE once it runs.
FAKE_SERVER = r"""
import http.server, os, subprocess, sys, time
mode, port, pidfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print("fake starting, env", os.environ.get("SPECGATE_FAKE_ENV"), flush=True)
if mode == "exit":
    print("boom: no such model folder", flush=True)
    sys.exit(3)
children = {
    "grandchild": "",
    "stubborn": "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)",
    "escape": "import os; os.setsid()",
}
if mode in children:
    code = children[mode] + "\nimport time; print('ready', flush=True); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    child.stdout.readline()
    with open(pidfile, "w") as f:
        f.write(str(child.pid))
healthy_at = time.monotonic() + (0.6 if mode == "slow" else 0)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and mode != "never" and time.monotonic() >= healthy_at
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


class MakeBackend(Protocol):
    def __call__(self, name: str, mode: str = "ok", port: int | None = None) -> LocalBackend: ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (read from /proc, no psutil)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "fake_server.py"
    path.write_text(FAKE_SERVER)
    return path


@pytest.fixture
def make_backend(script: Path, tmp_path: Path) -> Iterator[MakeBackend]:
    made: list[LocalBackend] = []

    def make(name: str, mode: str = "ok", port: int | None = None) -> LocalBackend:
        port = port or free_port()
        profile = BackendProfile(
            model="fake", served_model_name=name, port=port, env={"SPECGATE_FAKE_ENV": "seen"}
        )
        argv = [sys.executable, str(script), mode, str(port), str(tmp_path / f"{name}.pid")]
        backend = LocalBackend(name, profile, sys.executable, tmp_path / f"{name}.log", argv=argv)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.stop(timeout_s=2)


def grandchild_pid(backend: LocalBackend) -> int:
    return int(backend.log_path.with_suffix(".pid").read_text())


def test_wait_healthy_and_stop(make_backend: MakeBackend) -> None:
    backend = make_backend("ok")
    backend.start()
    seconds = backend.wait_healthy(10)
    assert 0 <= seconds < 10
    assert "fake starting, env seen" in backend.log_tail()  # profile.env reached the process
    assert backend.log_tail().startswith("# specgate: ")
    pid = backend.pid
    assert pid is not None and alive(pid)
    backend.stop()
    assert not alive(pid)
    backend.stop()  # idempotent


def test_progress_while_warming_up(make_backend: MakeBackend) -> None:
    backend = make_backend("slow", "slow")
    backend.start()
    progress: list[float] = []
    backend.wait_healthy(10, on_progress=progress.append, progress_every_s=0.2, interval_s=0.05)
    assert progress and progress == sorted(progress)


def test_early_exit_reports_log_tail(make_backend: MakeBackend) -> None:
    backend = make_backend("broken", "exit")
    backend.start()
    started = time.monotonic()
    with pytest.raises(BackendError, match="exited with code 3") as info:
        backend.wait_healthy(30)
    assert time.monotonic() - started < 10
    assert "boom: no such model folder" in info.value.log_tail
    assert "  | boom: no such model folder" in str(info.value)


def test_timeout_reports_log_tail(make_backend: MakeBackend) -> None:
    backend = make_backend("never", "never")
    backend.start()
    with pytest.raises(BackendError, match="not healthy after 1 s") as info:
        backend.wait_healthy(1, interval_s=0.1)
    assert "fake starting" in info.value.log_tail


def test_port_in_use_is_refused(make_backend: MakeBackend) -> None:
    first = make_backend("first")
    first.start()
    first.wait_healthy(10)
    second = make_backend("second", port=first.profile.port)
    with pytest.raises(BackendError, match="already in use"):
        second.start()


@pytest.mark.parametrize("mode", ["grandchild", "stubborn", "escape"])
def test_stop_leaves_no_process(make_backend: MakeBackend, mode: str) -> None:
    """SIGTERM reaches the group; a grandchild ignoring it is killed; one in its own session too."""
    backend = make_backend(mode, mode)
    backend.start()
    backend.wait_healthy(10)
    pids = [backend.pid, grandchild_pid(backend)]
    assert all(pid is not None and alive(pid) for pid in pids)
    started = time.monotonic()
    backend.stop(timeout_s=1)
    assert not any(alive(pid) for pid in pids if pid is not None)
    took = time.monotonic() - started
    if mode == "stubborn":  # SIGTERM ignored: killed after the 1 s grace period
        assert 1 <= took < 5
    else:
        assert took < 1


def test_stack_starts_all_and_stops_all(make_backend: MakeBackend) -> None:
    lines: list[str] = []
    backends = [make_backend("a", "grandchild"), make_backend("b", "slow")]
    with LocalStack(backends, timeout_s=10, log=lines.append) as stack:
        pids = [b.pid for b in backends] + [grandchild_pid(backends[0])]
        assert set(stack.healthy_after_s) == {"a", "b"}
        assert all(pid is not None and alive(pid) for pid in pids)
    assert not any(alive(pid) for pid in pids if pid is not None)
    assert any(line.startswith("[a] healthy after ") for line in lines)
    assert any(line.startswith("[b] healthy after ") and line.endswith(" s") for line in lines)


def test_stack_failure_stops_the_others(make_backend: MakeBackend) -> None:
    backends = [make_backend("good", "never"), make_backend("bad", "exit")]
    with pytest.raises(BackendError, match=r"\[bad\] exited with code 3"):
        with LocalStack(backends, timeout_s=30, log=lambda line: None):
            pytest.fail("the block must not run")
    assert not any(alive(b.pid) for b in backends if b.pid is not None)


def test_stack_stops_all_when_the_block_raises(make_backend: MakeBackend) -> None:
    backends = [make_backend("x", "grandchild"), make_backend("y")]
    with pytest.raises(KeyboardInterrupt):
        with LocalStack(backends, timeout_s=10, log=lambda line: None):
            pids = [b.pid for b in backends] + [grandchild_pid(backends[0])]
            raise KeyboardInterrupt
    assert not any(alive(pid) for pid in pids if pid is not None)
