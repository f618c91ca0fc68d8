"""Config validation: every problem reported with its field path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli.main import main
from contracts.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]


def base() -> dict:
    return yaml.safe_load((ROOT / "config" / "local.yaml").read_text())


@pytest.mark.parametrize("name", ["local.yaml", "production.example.yaml"])
def test_shipped_configs_are_valid(name: str) -> None:
    config = load_config(ROOT / "config" / name)
    assert config.rules


def test_local_config_defines_four_local_backends() -> None:
    config = load_config(ROOT / "config" / "local.yaml")
    methods = {n: b.spec.method for n, b in config.backends.items()}
    assert methods == {
        "plain": "none",
        "ngram": "ngram",
        "draft": "draft_model",
        "eagle3": "eagle3",
    }
    assert all(b.local for b in config.backends.values())
    assert {b.base_url for b in config.backends.values()} == {
        "http://127.0.0.1:8001",
        "http://127.0.0.1:8002",
        "http://127.0.0.1:8003",
        "http://127.0.0.1:8004",
    }
    assert config.pools == {"plain": ["plain"], "speculative": ["eagle3", "ngram", "draft"]}


def issues_of(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "x.yaml")
    return [(i.path, i.message) for i in info.value.issues]


def test_unknown_pool_and_backend_references() -> None:
    data = base()
    data["pools"]["speculative"].append("medusa")
    data["rules"][2]["fallbacks"] = ["nowhere"]
    data["defaults"]["pool"] = "missing"
    assert issues_of(data) == [
        ("pools.speculative.3", "unknown backend 'medusa'"),
        ("defaults.pool", "unknown pool 'missing'"),
        ("rules.2.fallbacks.0", "unknown pool 'nowhere'"),
    ]


def test_field_errors_name_their_path() -> None:
    data = base()
    data["backends"]["ngram"]["profile"]["speculation"]["num_speculative_tokens"] = "five"
    data["rules"][0]["match"]["tasks"] = ["poetry"]
    data["rules"][1]["colour"] = "red"
    paths = [p for p, _ in issues_of(data)]
    assert "backends.ngram.profile.speculation.num_speculative_tokens" in paths
    assert "rules.0.match.tasks.0" in paths
    assert "rules.1.colour" in paths


def test_speculation_method_needs_its_settings() -> None:
    data = base()
    del data["backends"]["draft"]["profile"]["speculation"]["model"]
    [(path, message)] = issues_of(data)
    assert path == "backends.draft.profile.speculation"
    assert "needs 'model'" in message


def test_duplicate_local_ports_and_rule_names() -> None:
    data = base()
    data["backends"]["ngram"]["profile"]["port"] = 8001
    data["rules"][1]["name"] = data["rules"][0]["name"]
    assert issues_of(data) == [
        ("rules.1.name", "duplicate rule name 'creative-plain'"),
        ("backends.ngram.profile.port", "port 8001 is also used by backend 'plain'"),
    ]


def test_config_check_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(ROOT / "config" / "local.yaml")]) == 0
    out = capsys.readouterr().out
    assert "ngram" in out and "code-rag-speculative" in out
    # --config FILE as every other command takes it; not both, not neither
    assert main(["config", "check", "--config", str(ROOT / "config" / "local.yaml")]) == 0
    assert "code-rag-speculative" in capsys.readouterr().out
    for argv in (["config", "check"], ["config", "check", "a.yaml", "--config", "b.yaml"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults: {pool: plain}\nbackends: {}\npools: {plain: [plain]}\n")
    assert main(["config", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}: backends:" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [\n")
    assert main(["config", "check", str(broken)]) == 1
    assert "invalid YAML" in capsys.readouterr().err
