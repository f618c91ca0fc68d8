"""`specgate up` keeps connections to the servers it launched between bursts.

The gateway drops an idle pooled connection after ``backend_keep_alive_s`` (4 s by default,
under vLLM's own 5 s idle timeout). When ``up`` launches every backend it sets their idle
timeout (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) and keeps connections 60 s; a server someone else
runs keeps vLLM's 5 s, so a config with one keeps the gateway at 4 s, as does a profile that
sets its own idle timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import launch
from contracts.config import GatewayConfig, parse_config
from contracts.paths import CachePaths
from gateway.settings import Settings


def config(*, remote: bool = False, env: dict[str, str] | None = None) -> GatewayConfig:
    """Two launched backends (plain, ngram), plus a server run elsewhere when ``remote``."""
    profile = {"model": "meta-llama/Llama-3.1-8B-Instruct", "served_model_name": "m"}
    backends: dict[str, object] = {
        "plain": {"local": True, "profile": profile | {"port": 18501, "env": env or {}}},
        "ngram": {
            "local": True,
            "profile": profile
            | {"port": 18502, "speculation": {"method": "ngram", "num_speculative_tokens": 4}},
        },
    }
    if remote:
        backends["far"] = {"url": "http://10.0.0.9:8000", "model": "m"}
    pools = {"all": list(backends)}
    return parse_config({"backends": backends, "pools": pools, "defaults": {"pool": "all"}}, "t")


def idle_timeouts(cfg: GatewayConfig, settings: Settings, tmp_path: Path) -> dict[str, str]:
    """Each launched server's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, as ``up`` would start it."""
    backends = launch.local_backends(
        cfg, CachePaths(tmp_path), tmp_path / "python", keep_alive_s=settings.backend_keep_alive_s
    )
    return {b.name: b.profile.launch_env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] for b in backends}


def test_up_that_launches_every_backend_keeps_connections_a_minute(tmp_path: Path) -> None:
    settings = launch.launched_keep_alive(Settings(), config())
    assert settings.backend_keep_alive_s == 60.0
    assert idle_timeouts(config(), settings, tmp_path) == {"plain": "65", "ngram": "65"}


def test_a_server_run_elsewhere_keeps_the_gateway_at_vllms_default(tmp_path: Path) -> None:
    cfg = config(remote=True)
    settings = launch.launched_keep_alive(Settings(), cfg)
    assert settings.backend_keep_alive_s == 4.0
    assert idle_timeouts(cfg, settings, tmp_path) == {"plain": "9", "ngram": "9"}


def test_an_operators_keep_alive_wins_and_the_servers_outlast_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECGATE_BACKEND_KEEP_ALIVE_S", "120.5")
    settings = launch.launched_keep_alive(Settings(), config())
    assert settings.backend_keep_alive_s == 120.5
    assert idle_timeouts(config(), settings, tmp_path) == {"plain": "126", "ngram": "126"}


def test_a_profiles_own_idle_timeout_wins_and_keeps_the_gateway_at_the_default(
    tmp_path: Path,
) -> None:
    cfg = config(env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "3", "OMP_NUM_THREADS": "2"})
    settings = launch.launched_keep_alive(Settings(), cfg)
    assert settings.backend_keep_alive_s == 4.0
    assert idle_timeouts(cfg, settings, tmp_path) == {"plain": "3", "ngram": "9"}
