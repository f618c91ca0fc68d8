"""`specgate up` keeps connections to the servers it launched between bursts, never longer
than a server keeps them.

The gateway drops an idle pooled connection after ``backend_keep_alive_s`` (4 s by default,
under vLLM's own 5 s idle timeout). When ``up`` launches every backend it sets their idle
timeout (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) and keeps connections 60 s; a server someone else
runs keeps vLLM's 5 s, so a config with one keeps the gateway at 4 s; a profile's own idle
timeout caps the gateway at 0.8 of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backends import keep_alive
from cli import launch
from contracts.config import GatewayConfig, parse_config
from contracts.paths import CachePaths
from gateway.settings import Settings


@pytest.fixture(autouse=True)
def no_keep_alive_setting(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The tests set ``SPECGATE_BACKEND_KEEP_ALIVE_S`` themselves, or not at all."""
    monkeypatch.delenv("SPECGATE_BACKEND_KEEP_ALIVE_S", raising=False)
    yield


def config(
    *, remote: bool = False, env: dict[str, str] | None = None, url: str | None = None
) -> GatewayConfig:
    """Two launched backends (plain, ngram), plus a server run elsewhere when ``remote``;
    ``env`` for plain's profile, ``url`` for plain's own URL."""
    profile = {"model": "meta-llama/Llama-3.1-8B-Instruct", "served_model_name": "m"}
    plain: dict[str, object] = {
        "local": True,
        "profile": profile | {"port": 18501, "env": env or {}},
    }
    if url:
        plain["url"] = url
    backends: dict[str, object] = {
        "plain": plain,
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


def started(cfg: GatewayConfig, tmp_path: Path) -> tuple[float, dict[str, str]]:
    """As ``up`` would start them: the gateway's keep-alive and each launched server's
    VLLM_HTTP_TIMEOUT_KEEP_ALIVE."""
    settings = launch.launched_keep_alive(Settings(), cfg)
    backends = launch.local_backends(
        cfg, CachePaths(tmp_path), tmp_path / "python", keep_alive_s=settings.backend_keep_alive_s
    )
    idle = {b.name: b.profile.launch_env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] for b in backends}
    return settings.backend_keep_alive_s, idle


def test_the_gateways_default_is_the_rules_default() -> None:
    assert Settings().backend_keep_alive_s == keep_alive.DEFAULT_KEEP_ALIVE_S == 4.0


def test_up_that_launches_every_backend_keeps_connections_a_minute(tmp_path: Path) -> None:
    assert started(config(), tmp_path) == (60.0, {"plain": "65", "ngram": "65"})


def test_a_server_run_elsewhere_keeps_the_gateway_at_vllms_default(tmp_path: Path) -> None:
    assert started(config(remote=True), tmp_path) == (4.0, {"plain": "9", "ngram": "9"})


def test_a_backend_reached_at_another_url_counts_as_run_elsewhere(tmp_path: Path) -> None:
    cfg = config(url="http://lb.internal:9000")  # e.g. a proxy with its own idle timeout
    assert started(cfg, tmp_path) == (4.0, {"plain": "9", "ngram": "9"})


def test_an_operators_keep_alive_wins_and_the_servers_outlast_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECGATE_BACKEND_KEEP_ALIVE_S", "120.5")
    assert started(config(), tmp_path) == (120.5, {"plain": "126", "ngram": "126"})


@pytest.mark.parametrize(
    ("own", "gateway", "ngram"),
    [("3", 2.4, "8"), ("300", 4.0, "9")],  # 0.8 of a short one; a long one changes nothing
)
def test_a_profiles_own_idle_timeout_wins_and_caps_the_gateway(
    tmp_path: Path, own: str, gateway: float, ngram: str
) -> None:
    cfg = config(env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": own, "OMP_NUM_THREADS": "2"})
    keep, idle = started(cfg, tmp_path)
    assert keep == pytest.approx(gateway)
    assert idle == {"plain": own, "ngram": ngram}


def test_an_operators_keep_alive_above_a_profiles_own_timeout_is_capped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECGATE_BACKEND_KEEP_ALIVE_S", "60")
    keep, idle = started(config(env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "30"}), tmp_path)
    assert keep == pytest.approx(24.0)
    assert idle == {"plain": "30", "ngram": "29"}


def test_a_long_keep_alive_with_a_server_run_elsewhere_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECGATE_BACKEND_KEEP_ALIVE_S", "60")
    assert started(config(remote=True), tmp_path)[0] == 60.0  # the operator's call
    assert "warning: SPECGATE_BACKEND_KEEP_ALIVE_S=60 s: keep it below the idle timeout of far" in (
        capsys.readouterr().out
    )
