"""An idle keep-alive connection outlives clients' pool idle expiry (issue 26).

httpx (and so the OpenAI SDK) keeps an idle connection for 5 s; uvicorn closes one after 5 s
by default. A client that reuses its connection just as the server closes it gets a
``ReadError`` for a request the server never read whole: every HTTP/1.1 server has that race
when its idle timeout is not longer than its clients' (docs/benchmarks.md, "Keep-alive").
``specgate serve`` (what ``specgate up`` ends in) is started here as a process, as a user
starts it, and one connection is reused after an idle gap longer than uvicorn's default.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.servers import free_port
from tests.unit.conftest import ROOT

#: uvicorn's default ``timeout_keep_alive`` (seconds) and httpx's ``keepalive_expiry``.
CLIENT_POOL_IDLE_S = 5.0
REQUEST = b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"


@pytest.fixture
def gateway_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = os.environ | {
        "SPECGATE_STATE_FILE": str(tmp_path / "state.json"),
        "SPECGATE_LOG_LEVEL": "warning",
        "SPECGATE_SAMPLE_CANARY_INTERVAL_S": "0",
    }
    argv = [sys.executable, "-m", "cli", "serve", "--config", str(ROOT / "config" / "local.yaml")]
    argv += ["--port", str(port)]
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp_path / "gateway.log").read_text()[-2000:])
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def answer(conn: socket.socket) -> bytes:
    """One HTTP response's head and body from ``conn`` (b"" when the server closed it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head


def test_an_idle_connection_is_still_served_after_the_clients_pool_expiry(
    gateway_url: str,
) -> None:
    host, port = gateway_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(REQUEST)
        assert answer(conn).startswith(b"HTTP/1.1 200")
        time.sleep(CLIENT_POOL_IDLE_S + 1.0)  # past uvicorn's default: it had closed it
        conn.sendall(REQUEST)
        assert answer(conn).startswith(b"HTTP/1.1 200")
