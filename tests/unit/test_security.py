"""Client API keys, the admin token, refusing an unsafe listener, config reload."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import SecretStr

from cli.main import main
from gateway.app import create_app
from gateway.auth import InsecureSettings
from gateway.settings import Settings
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.transport import BackendsTransport
from tests.unit.conftest import MODEL, ROOT

BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 4, "temperature": 0}


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text((ROOT / "config" / "local.yaml").read_text())
    return path


async def client_for(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, dict]]:
    fakes = {n: FakeBehaviour(name=n) for n in ("plain", "ngram", "draft", "eagle3")}
    ports = {"plain": 8001, "ngram": 8002, "draft": 8003, "eagle3": 8004}
    apps = {f"127.0.0.1:{ports[n]}": create_fake_vllm(f) for n, f in fakes.items()}
    app = create_app(settings, transport=BackendsTransport(apps), rng=random.Random(0))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client, fakes


@pytest.fixture
async def secured(
    config_file: Path, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, dict]]:
    keys = tmp_path / "keys.txt"
    keys.write_text("# team keys\nkey-from-file\n\n")
    settings = Settings(
        config=config_file,
        health_interval_s=60,
        api_keys=SecretStr("key-one, key-two"),
        api_keys_file=keys,
        admin_token=SecretStr("admin-secret"),
    )
    async for pair in client_for(settings):
        yield pair


async def test_client_keys(secured: tuple[httpx.AsyncClient, dict]) -> None:
    client, fakes = secured
    for auth in (None, "Bearer nope", "Basic key-one", "Bearer "):
        headers = {"authorization": auth} if auth else {}
        resp = await client.post("/v1/completions", json=BODY, headers=headers)
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "invalid_api_key"
    for key in ("key-one", "key-two", "key-from-file"):
        resp = await client.post(
            "/v1/completions", json=BODY, headers={"authorization": f"Bearer {key}"}
        )
        assert resp.status_code == 200
    # the client's key never reaches a backend
    assert all("authorization" not in r["headers"] for f in fakes.values() for r in f.received)
    assert (await client.get("/health")).status_code == 200  # probes stay open
    # relayed backend paths need a client key too
    assert (await client.post("/tokenize", json={"prompt": "x"})).status_code == 401
    ok = await client.post(
        "/tokenize", json={"prompt": "x"}, headers={"authorization": "Bearer key-one"}
    )
    assert ok.status_code == 200
    # except the probes vLLM with --api-key answers without one (its middleware guards only
    # /v1, /v2, /inference, /cohere): /version relayed, /ping not 401 (this fake lacks it)
    version = await client.get("/version")
    assert version.status_code == 200 and version.json()["version"]
    assert (await client.get("/ping")).status_code == 404
    assert (await client.post("/invocations", json=BODY)).status_code == 401  # it generates
    # their bodies are relayed unparsed and small: no model check, no large parse, keyless
    guess = await client.request("GET", "/version", json={"model": "guess"})
    assert guess.status_code == 200
    big = await client.request("GET", "/version", content=b"[" + b"0," * 40_000 + b"0]")
    assert big.status_code == 413


async def test_admin_endpoints_need_the_admin_token(
    secured: tuple[httpx.AsyncClient, dict],
) -> None:
    client, _ = secured
    for method, path in (
        ("GET", "/routes"),
        ("POST", "/routes/reload"),
        ("GET", "/status"),
        ("POST", "/routes/explain"),
        ("POST", "/routes/backends/plain/reset_prefix_cache"),
    ):
        resp = await client.request(method, path, headers={"authorization": "Bearer key-one"})
        assert resp.status_code == 401, path
        assert resp.json()["error"]["code"] == "invalid_admin_token"
    ok = await client.get("/routes", headers={"authorization": "Bearer admin-secret"})
    assert ok.status_code == 200


def test_unsafe_listener_is_refused(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InsecureSettings, match="SPECGATE_ADMIN_TOKEN"):
        create_app(Settings(config=config_file, host="0.0.0.0"))
    create_app(Settings(config=config_file, host="0.0.0.0", admin_enabled=False))
    create_app(Settings(config=config_file, host="0.0.0.0", admin_token=SecretStr("t")))
    assert main(["serve", "--config", str(config_file), "--host", "0.0.0.0"]) == 1
    assert "no admin token" in capsys.readouterr().err


def rewrite(path: Path, change: Callable[[dict], dict]) -> None:
    path.write_text(yaml.safe_dump(change(yaml.safe_load(path.read_text()))))


async def test_reload_swaps_a_valid_config_and_refuses_an_invalid_one(
    config_file: Path,
) -> None:
    settings = Settings(config=config_file, health_interval_s=60)
    async for client, _ in client_for(settings):
        first = await client.post("/v1/completions", json=BODY, headers={"x-task-type": "code"})
        assert first.headers["x-specgate-rule"] == "code-rag-speculative"
        rewrite(
            config_file, lambda data: data | {"rules": [{"name": "all-plain", "pool": "plain"}]}
        )
        resp = await client.post("/routes/reload")
        assert resp.status_code == 200 and resp.json()["rules"] == ["all-plain"]
        after = await client.post("/v1/completions", json=BODY, headers={"x-task-type": "code"})
        assert after.headers["x-specgate-rule"] == "all-plain"
        assert after.headers["x-specgate-backend"] == "plain"
        rewrite(config_file, lambda _: {"rules": [{"name": "broken", "pool": "nowhere"}]})
        bad = await client.post("/routes/reload")
        assert bad.status_code == 400
        error = bad.json()["error"]
        assert error["code"] == "invalid_config"
        assert {"path": "defaults", "message": "Field required"} in error["issues"]
        still = await client.post("/v1/completions", json=BODY, headers={"x-task-type": "code"})
        assert still.headers["x-specgate-rule"] == "all-plain"  # the old config stayed
        routes = (await client.get("/routes")).json()
        assert routes["decisions"]["by_rule"] == {"code-rag-speculative": 1, "all-plain": 2}
