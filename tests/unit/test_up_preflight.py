"""`specgate up` runs the pre-launch checks before any server starts (bug from issue #14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends import launcher
from cli import launch
from contracts.config import parse_config
from gateway.settings import Settings

#: Known model cards (backends.model_info.KNOWN_MODELS): 128,256 vs 151,936 tokens.
TARGET, OTHER_FAMILY = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"


def config_with_draft(draft: str) -> dict[str, object]:
    profile = {
        "model": TARGET,
        "served_model_name": "m",
        "port": 18431,
        "speculation": {"method": "draft_model", "model": draft, "num_speculative_tokens": 3},
    }
    return {
        "backends": {"spec": {"local": True, "profile": profile}},
        "pools": {"speculative": ["spec"]},
        "defaults": {"pool": "speculative"},
    }


def test_up_refuses_a_draft_with_another_vocabulary_before_any_server_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[str] = []
    monkeypatch.setattr(launch, "prepare", lambda _settings: Path(tmp_path / "python"))
    monkeypatch.setattr(launcher.LocalBackend, "start", lambda self: started.append(self.name))
    monkeypatch.setenv("SPECGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(launch.signal, "signal", lambda *_args: None)  # keep pytest's SIGTERM
    config = parse_config(config_with_draft(OTHER_FAMILY), "test")
    code = launch.up(Settings(), config, startup_timeout_s=5)
    out = capsys.readouterr().out
    assert code == 1
    assert started == []
    assert "error: backend 'spec': speculation.model: draft vocab_size 151936" in out
    assert "refusing to start the local stack" in out


def test_up_says_when_it_stopped_the_backends_it_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """uvicorn takes Ctrl-C itself and returns: ``up`` then stops its servers and says so."""
    events: list[str] = []
    monkeypatch.setattr(launch, "prepare", lambda _settings: Path(tmp_path / "python"))
    monkeypatch.setattr(launcher.LocalBackend, "start", lambda self: events.append("start"))
    monkeypatch.setattr(launcher.LocalBackend, "wait_healthy", lambda self, *_a, **_k: 0.1)
    monkeypatch.setattr(
        launcher.LocalBackend, "stop", lambda self, *_a, **_k: events.append("stop")
    )
    monkeypatch.setattr(launch, "run_gateway", lambda *_a, **_k: events.append("served"))
    monkeypatch.setenv("SPECGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(launch.signal, "signal", lambda *_args: None)  # keep pytest's SIGTERM
    config = parse_config(config_with_draft(TARGET), "test")
    assert launch.up(Settings(), config, startup_timeout_s=5) == 0
    assert events[:2] == ["start", "served"] and "stop" in events[2:]
    assert "gateway stopped: stopped every backend this started" in capsys.readouterr().out
