"""Run a gateway container's command against fake backends in a private network namespace.

:func:`run_scenario` starts ``python -m tests.fakes.sandbox SCENARIO.json`` under
``unshare --net --mount`` (plus ``--user --map-root-user`` when not root). Inside, only a
loopback interface exists and ``/etc/hosts`` is a private bind mount, so:

- each backend service name resolves, through the system resolver the gateway really uses
  (glibc's ``getaddrinfo`` via uvloop), to its own loopback address (127.0.0.10, .11, ...),
  where a fake vLLM serves on the service's own port: the config's URLs are used as written;
- the gateway runs with the container's environment and port. One change: with
  ``listen_host`` set it listens there (127.0.0.1) instead of the container's 0.0.0.0, which
  in one namespace would collide with the backends' fakes on the same port (in the real
  stacks each container has its own network). The decision that depends on the listen
  address, :func:`gateway.auth.build_auth`, is first made on the unchanged environment
  (``preflight``, as ``specgate serve`` makes it before it binds);
- the declared health check runs as written (``127.0.0.1:PORT`` inside the namespace), and
  nothing outside the namespace can reach what listens in it.

The sandbox then sends a routed request with the client key, and asks ``/routes`` with and
without the admin token, and prints an :class:`Observed` as its last stdout line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
FIRST_ALIAS = 10  # backend i resolves to 127.0.0.(10 + i)
#: what ``specgate serve`` checks before it binds (cli/main.py main): config and listener
PREFLIGHT = """
from gateway.auth import build_auth
from contracts.config import load_config
from gateway.settings import Settings
settings = Settings()
load_config(settings.config)
build_auth(settings)
"""


class FakeService(BaseModel):
    """A fake vLLM standing in for service ``host`` on ``port``, serving ``model``."""

    host: str
    port: int
    model: str
    argv: list[str] | None = None  # not vLLM: this command runs instead (redis-server)


class Scenario(BaseModel):
    """What to start, and how to check it. ``expect_start=False``: only wait for the gateway
    to exit (it should refuse to start) and report its exit code and log."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    backends: list[FakeService]
    health_argv: list[str] | None = None
    probe_paths: list[str] = []
    port: int
    probe_port: int | None = None  # where probe_paths are asked (None: ``port``)
    model: str
    client_key: str | None = None
    admin_token: str | None = None
    expect_start: bool = True
    listen_host: str | None = None
    timeout_s: float = 30.0


class Observed(BaseModel):
    """What happened. Statuses are HTTP codes; ``health`` the health check's exit code."""

    exit_code: int | None = None
    log: str = ""
    preflight: int | None = None  # build_auth on the unchanged environment: 0 = accepted
    healthy: bool = False
    health: int | None = None
    probes: dict[str, int] = {}
    routed: int | None = None
    routed_backend: str | None = None
    hits: dict[str, int] = {}
    no_key: int | None = None
    routes_no_token: int | None = None
    routes_with_token: int | None = None
    state: dict[str, Any] | None = None  # /routes' state section (with the admin token)


def unshare_argv() -> list[str]:
    """The ``unshare`` prefix for a private network and mount namespace."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", "--net", "--mount", *user]


def sandbox_problem() -> str | None:
    """Why no sandbox can run here (``None`` when one can)."""
    for tool in ("unshare", "ip", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    probe = subprocess.run(
        [*unshare_argv(), "true"], capture_output=True, text=True, timeout=30, check=False
    )
    return None if probe.returncode == 0 else f"unshare refused: {probe.stderr.strip()}"


def run_scenario(scenario: Scenario, workdir: Path) -> Observed:
    """Run ``scenario`` in a fresh namespace; ``workdir`` holds its JSON and the log."""
    spec = workdir / "scenario.json"
    spec.write_text(scenario.model_dump_json(), encoding="utf-8")
    proc = subprocess.run(
        [*unshare_argv(), sys.executable, "-m", "tests.fakes.sandbox", str(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scenario.timeout_s * 3 + 30,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"sandbox failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return Observed.model_validate_json(proc.stdout.strip().splitlines()[-1])


# -- inside the namespace -----------------------------------------------------------------


def _isolate(workdir: Path, names: list[str]) -> None:
    """Bring loopback up and map each name to its loopback alias in a private /etc/hosts."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    hosts = workdir / "hosts"
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    lines += [f"127.0.0.{FIRST_ALIAS + i} {name}" for i, name in enumerate(names)]
    hosts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)


def _wait_healthy(s: Scenario, gateway: subprocess.Popen[bytes], env: dict[str, str]) -> Observed:
    seen = Observed()
    deadline = time.monotonic() + s.timeout_s
    probe_url = f"http://127.0.0.1:{s.probe_port or s.port}"
    with httpx.Client(base_url=probe_url, trust_env=False) as client:
        while time.monotonic() < deadline and gateway.poll() is None:
            if s.health_argv is not None:
                check = subprocess.run(s.health_argv, env=env, cwd=s.cwd, timeout=10, check=False)
                seen.health = check.returncode
                seen.healthy = check.returncode == 0
            for path in s.probe_paths:
                with contextlib.suppress(httpx.TransportError):
                    seen.probes[path] = client.get(path, timeout=5).status_code
            if s.probe_paths and len(seen.probes) == len(s.probe_paths):
                seen.healthy = all(200 <= code < 400 for code in seen.probes.values())
            if seen.healthy:
                break
            time.sleep(0.3)
    return seen


def _exercise(s: Scenario, seen: Observed) -> None:
    """A routed request with the client key; the same without; /routes without and with the
    admin token."""
    body = {
        "model": s.model,
        "messages": [{"role": "user", "content": "def add(a, b):"}],
        "temperature": 0,
        "max_tokens": 8,
    }
    key = {"Authorization": f"Bearer {s.client_key}"} if s.client_key else {}
    task = {"X-Task-Type": "code"}
    with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", trust_env=False) as client:
        routed = client.post("/v1/chat/completions", json=body, headers=key | task, timeout=30)
        seen.routed = routed.status_code
        seen.routed_backend = routed.headers.get("x-specgate-backend")
        seen.no_key = client.post("/v1/chat/completions", json=body, headers=task).status_code
        seen.routes_no_token = client.get("/routes").status_code
        if s.admin_token:
            bearer = {"Authorization": f"Bearer {s.admin_token}"}
            routes = client.get("/routes", headers=bearer)
            seen.routes_with_token = routes.status_code
            if routes.status_code == 200:
                seen.state = routes.json().get("state")


def _stop(gateway: subprocess.Popen[bytes]) -> None:
    if gateway.poll() is None:
        gateway.send_signal(signal.SIGTERM)
        try:
            gateway.wait(timeout=20)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait()


@contextlib.contextmanager
def _running(argv: list[str]) -> Any:
    """Run ``argv`` for the block (output discarded), killed at its end."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def sandbox_main(spec: Path) -> Observed:
    """Everything inside the namespace: fakes, the gateway, checks; returns what was seen."""
    from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
    from tests.fakes.servers import running_server

    s = Scenario.model_validate_json(spec.read_text(encoding="utf-8"))
    names = list(dict.fromkeys(b.host for b in s.backends))
    _isolate(spec.parent, names)
    fakes = {b.host: FakeBehaviour(name=b.host, model=b.model) for b in s.backends if not b.argv}
    log = spec.parent / "gateway.log"
    with contextlib.ExitStack() as stack:
        for b in s.backends:
            ip = f"127.0.0.{FIRST_ALIAS + names.index(b.host)}"
            if b.argv:  # the service's own command, on its address
                stack.enter_context(_running(b.argv + ["--bind", ip, "--port", str(b.port)]))
                continue
            stack.enter_context(running_server(create_fake_vllm(fakes[b.host]), b.port, ip))
        python = shutil.which("python3", path=s.env["PATH"]) or "python3"
        preflight = subprocess.Popen(  # alongside the gateway's start: both import it all
            [python, "-c", PREFLIGHT], env=s.env, cwd=s.cwd, stderr=subprocess.DEVNULL
        )
        env = s.env | ({"SPECGATE_HOST": s.listen_host} if s.listen_host else {})
        with log.open("wb") as out:
            gateway = subprocess.Popen(
                s.argv, env=env, cwd=s.cwd, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            if not s.expect_start:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    gateway.wait(timeout=s.timeout_s)
                seen = Observed()
            else:
                seen = _wait_healthy(s, gateway, env)
                if seen.healthy:
                    _exercise(s, seen)
        finally:
            _stop(gateway)
    seen.exit_code = gateway.returncode
    seen.preflight = preflight.wait(timeout=s.timeout_s)
    seen.hits = {name: len(f.received) for name, f in fakes.items()}
    seen.log = log.read_text(encoding="utf-8", errors="replace")[-4000:]
    return seen


if __name__ == "__main__":
    print(sandbox_main(Path(sys.argv[1])).model_dump_json())
