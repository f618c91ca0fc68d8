"""The supervisor against fake server processes: restart on exit and on a dead engine,
backoff, the cap per window, the crashed log's tail."""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from backends.launcher import LocalBackend, LocalStack
from backends.supervisor import RestartPolicy, Supervisor, error_lines
from cli import launch
from contracts.launch_profile import BackendProfile
from gateway.settings import Settings
from tests.fakes.servers import free_port

# argv: PORT MODE COUNTFILE. Counts its starts in COUNTFILE; POST /die exits (code 7) after
# printing a traceback-like line; mode "dead-engine" answers /health 503 after POST /die
# instead of exiting; mode "slow-health" answers /health after 3 s from then on (busy);
# mode "crashloop" exits at once from the second start on.
FAKE = r"""
import http.server, os, sys, time
port, mode, countfile = int(sys.argv[1]), sys.argv[2], sys.argv[3]
starts = int(open(countfile).read()) + 1 if os.path.exists(countfile) else 1
open(countfile, "w").write(str(starts))
print(f"fake start {starts}", flush=True)
if mode == "crashloop" and starts > 1:
    print("RuntimeError: CPU Generator does not use offset", flush=True)
    sys.exit(1)
dead = False

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if dead and mode == "slow-health":
            time.sleep(3)
        self.send_response(503 if dead and mode == "dead-engine" else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        global dead
        print("RuntimeError: CPU Generator does not use offset", flush=True)
        print("vllm.v1.engine.exceptions.EngineDeadError", flush=True)
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()
        if mode in ("dead-engine", "slow-health"):
            dead = True
        else:
            os._exit(7)

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

FAST = RestartPolicy(backoff_s=0.1, max_backoff_s=0.4, max_restarts=2, window_s=60, stable_s=60)


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[Callable[[str], LocalStack]]:
    stacks: list[LocalStack] = []

    def make(mode: str) -> LocalStack:
        port = free_port()
        profile = BackendProfile(model="fake", served_model_name="fake", port=port)
        argv = [sys.executable, "-c", FAKE, str(port), mode, str(tmp_path / "starts")]
        backend = LocalBackend("plain", profile, "", tmp_path / "plain.log", argv=argv)
        stack = LocalStack([backend], timeout_s=20, log=lambda _line: None)
        stack.start()
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.stop()


def wait_for(check: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def kill(stack: LocalStack) -> None:
    httpx.post(f"{stack.backends[0].url}/die")


def test_error_lines_keep_the_root_cause_above_the_noise() -> None:
    log = "\n".join(
        ["INFO start", "ERROR x RuntimeError: CPU Generator does not use offset"]
        + [f"INFO shutdown {i}" for i in range(100)]
        + [
            "EngineDeadError: EngineCore encountered an issue",
            "ERROR x RuntimeError: CPU Generator does not use offset",
        ]
    )
    assert error_lines(log) == [
        "ERROR x RuntimeError: CPU Generator does not use offset",
        "EngineDeadError: EngineCore encountered an issue",
    ]


def test_policy_backoff_doubles_and_caps() -> None:
    policy = RestartPolicy(backoff_s=1, max_backoff_s=5, max_restarts=2, window_s=10)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 5, 5]
    times: deque[float] = deque([0.0, 5.0])
    assert not policy.allows(times, 9.0)
    assert policy.allows(times, 10.0) and list(times) == [5.0]


@pytest.mark.parametrize("mode", ["exit", "dead-engine"])
def test_a_crashed_server_is_restarted_and_its_log_tail_kept(
    make_stack: Callable[[str], LocalStack], mode: str
) -> None:
    stack = make_stack(mode)
    first_pid = stack.backends[0].pid
    lines: list[str] = []
    supervisor = Supervisor(stack, FAST, engine_dead_after_s=0.5, interval_s=0.1, log=lines.append)
    with supervisor:
        kill(stack)
        wait_for(lambda: supervisor.view()["plain"]["restarts"] == 1)
        wait_for(lambda: supervisor.view()["plain"]["state"] == "running")
        view = supervisor.view()["plain"]
        assert httpx.get(f"{stack.backends[0].url}/health").status_code == 200
    assert stack.backends[0].pid != first_pid
    crash = view["last_crash"]
    assert "CPU Generator does not use offset" in crash["log_tail"]
    assert crash["errors"][-2:] == [
        "RuntimeError: CPU Generator does not use offset",
        "vllm.v1.engine.exceptions.EngineDeadError",
    ]
    if mode == "exit":
        assert crash["exit_code"] == 7 and crash["reason"] == "process exited with code 7"
    else:
        assert "engine dead" in crash["reason"]
    assert stack.backends[0].log_path.with_name("plain.log.1").exists()
    assert any("restarted, healthy after" in line for line in lines)


def test_a_slow_health_is_load_not_a_dead_engine(
    make_stack: Callable[[str], LocalStack],
) -> None:
    """/health slower than the supervisor's 2 s timeout for longer than engine_dead_after_s:
    the server is busy, not dead, and is not restarted (issue 26: a slow probe is load)."""
    stack = make_stack("slow-health")
    pid = stack.backends[0].pid
    supervisor = Supervisor(
        stack, FAST, engine_dead_after_s=0.5, interval_s=0.1, log=lambda _: None, hung_after_s=60
    )
    with supervisor:
        kill(stack)  # from now on /health takes 3 s
        time.sleep(5)
        view = supervisor.view()["plain"]
    assert view["restarts"] == 0 and view["state"] == "running"
    assert stack.backends[0].pid == pid


def test_a_server_that_never_answers_health_is_hung(
    make_stack: Callable[[str], LocalStack],
) -> None:
    stack = make_stack("slow-health")
    supervisor = Supervisor(
        stack, FAST, engine_dead_after_s=0.5, interval_s=0.1, log=lambda _: None, hung_after_s=1
    )
    with supervisor:
        kill(stack)
        wait_for(lambda: supervisor.view()["plain"]["restarts"] == 1)
        view = supervisor.view()["plain"]
    assert "(hung)" in view["last_crash"]["reason"]


def test_restarts_are_capped_per_window(make_stack: Callable[[str], LocalStack]) -> None:
    stack = make_stack("crashloop")
    with Supervisor(stack, FAST, interval_s=0.1, log=lambda _line: None) as supervisor:
        kill(stack)
        wait_for(lambda: supervisor.view()["plain"]["state"] == "given_up")
        view = supervisor.view()["plain"]
    assert view["restarts"] == 2 and view["crashes"] == 3
    assert "CPU Generator does not use offset" in view["last_crash"]["log_tail"]


def test_specgate_ups_supervisor_logs_through_logging(
    make_stack: Callable[[str], LocalStack], caplog: pytest.LogCaptureFixture
) -> None:
    """``specgate up``'s supervisor lines are log records (time, level, logger), read beside
    the gateway's own; they were bare prints without a time."""
    stack = make_stack("exit")
    settings = Settings(restart_backoff_s=0.1, engine_dead_after_s=0.5)
    caplog.set_level(logging.WARNING, logger="specgate.supervisor")
    with launch.supervisor(stack, settings, startup_timeout_s=30) as watching:
        kill(stack)
        wait_for(lambda: watching.view()["plain"]["state"] == "running" and any(
            "restarted, healthy after" in r.getMessage() for r in caplog.records
        ))  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if r.name == "specgate.supervisor"]
    assert lines[0].startswith("[plain] crashed: process exited with code 7")
    assert all(
        r.levelno == logging.WARNING for r in caplog.records if r.name == "specgate.supervisor"
    )
