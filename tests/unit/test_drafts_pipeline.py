"""``specgate drafts train``'s orchestration on tiny data: input checks before anything starts,
resumable stages, checkpoint choice, atomic publication, CPU flags (no real training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.drafts.cpu_train import cpu_argv
from backends.drafts.pipeline import Plan, Stages, best_checkpoint, plan_run, publish_head
from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tests" / "data" / "drafts" / "smoke_prompts.jsonl"


def test_plan_estimates_tokens_and_hidden_state_disk() -> None:
    plan = plan_run(SMOKE, max_samples=0, max_new_tokens=16, hidden_size=576)
    assert plan.prompts == 24 and plan.tokens > 24 * 16
    assert plan.hidden_bytes == plan.tokens * 4 * 576 * 2
    assert plan_run(SMOKE, 5, 16, 576).prompts == 5


def test_plan_names_the_bad_line(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    good = json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]})
    prompts.write_text(f"{good}\n\n{json.dumps({'id': 'b', 'messages': []})}\n")
    with pytest.raises(ValueError, match=r"p\.jsonl:3: bad prompt line"):
        plan_run(prompts, 0, 16, 576)
    prompts.write_text("")
    with pytest.raises(ValueError, match="no prompts"):
        plan_run(prompts, 0, 16, 576)


def test_stages_skip_what_is_marked_done(tmp_path: Path) -> None:
    ran: list[str] = []
    lines: list[str] = []
    stages = Stages(tmp_path, Plan(10, 1000, 576), epochs=1, log=lines.append)
    stages.run("distill", lambda: ran.append("distill"))
    assert (tmp_path / "distill.done").exists()
    stages.run("distill", lambda: ran.append("again"))
    assert ran == ["distill"] and "skipped" in lines[-1]
    with pytest.raises(RuntimeError):
        stages.run("hidden", lambda: (_ for _ in ()).throw(RuntimeError("killed")))
    assert not (tmp_path / "hidden.done").exists()  # an interrupted stage reruns
    assert any("ETA" in line for line in lines)


def _ckpt(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x")
    return folder


def test_best_checkpoint_prefers_best_then_last_epoch(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        best_checkpoint(tmp_path)
    _ckpt(tmp_path / "2")
    assert best_checkpoint(tmp_path) == tmp_path / "2"
    _ckpt(tmp_path / "10")
    assert best_checkpoint(tmp_path) == tmp_path / "10"
    _ckpt(tmp_path / "checkpoint_best")
    assert best_checkpoint(tmp_path) == tmp_path / "checkpoint_best"


def test_publish_head_never_leaves_a_half_written_head(tmp_path: Path) -> None:
    source, out = _ckpt(tmp_path / "ckpt"), _ckpt(tmp_path / "head")
    (out / "model.safetensors").write_bytes(b"old")

    def broken(folder: Path) -> None:
        raise OSError("strip failed")

    with pytest.raises(OSError):
        publish_head(source, out, broken)
    assert (out / "model.safetensors").read_bytes() == b"old"  # the old head still served
    publish_head(source, out, lambda folder: (folder / "stripped").touch())
    assert (out / "stripped").exists() and (out / "model.safetensors").read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "head"]


def test_cpu_flags_are_added_unless_given() -> None:
    argv = cpu_argv(["train", "--loss-implementation=fused", "--epochs", "1"])
    assert argv[-4:] == ["--draft-attn-impl", "sdpa", "--hidden-states-dtype", "float32"]
    assert "eager" not in argv


@pytest.fixture
def config(tmp_path: Path) -> Path:
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 32}))
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "backends:\n  plain:\n    url: http://127.0.0.1:9\n    local: true\n"
        f"    profile: {{model: {target}, served_model_name: m, port: 9}}\n"
        "pools: {plain: [plain]}\ndefaults: {pool: plain}\n"
    )
    return path


def test_train_refuses_bad_prompts_before_anything_starts(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("not json\n")
    out = tmp_path / "out"
    code = main(
        ["drafts", "train", "--config", str(config), "--prompts", str(prompts), "--out", str(out)]
    )
    assert code == 2 and f"{prompts}:1: bad prompt line" in capsys.readouterr().err
    assert not out.exists() and not out.with_name("out.work").exists()


def test_check_refuses_bad_heads_before_any_server(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    assert main(["drafts", "check", str(head), "--config", str(config)]) == 2
    assert "without transformer_layer_config" in capsys.readouterr().err
    assert main(["drafts", "check", str(tmp_path / "none"), "--config", str(config)]) == 2
    assert "no such head folder" in capsys.readouterr().err


def test_speculators_env_is_ready_only_with_a_matching_marker(tmp_path: Path) -> None:
    from backends.drafts import spec_env
    from contracts.paths import CachePaths

    paths = CachePaths(tmp_path)
    python = spec_env.speculators_python(paths)
    assert python == tmp_path / "speculators-venv" / "bin" / "python"
    assert not spec_env.is_speculators_env_ready(paths)
    python.parent.mkdir(parents=True)
    python.touch()
    marker = python.parents[1] / spec_env.MARKER_NAME
    marker.write_text(json.dumps({"requirements": ["speculators==0.8.0"]}))
    assert not spec_env.is_speculators_env_ready(paths)  # other pins: set up again
    marker.write_text(json.dumps(spec_env._expected_marker(paths)))
    assert spec_env.is_speculators_env_ready(paths)
    assert spec_env.ensure_speculators_env(paths, Path("/nonexistent")) == python  # cached


@pytest.mark.parametrize("flag", ["--epochs", "--max-new-tokens", "--gate-prompts"])
def test_train_refuses_non_positive_settings(
    tmp_path: Path, config: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["drafts", "train", "--config", str(config), "--prompts", str(SMOKE)]
    assert main([*argv, "--out", str(tmp_path / "out"), flag, "0"]) == 2
    assert f"{flag} must be at least 1" in capsys.readouterr().err


def test_train_refuses_missing_gate_prompts_before_training(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["drafts", "train", "--config", str(config), "--prompts", str(SMOKE)]
    assert main([*argv, "--out", str(tmp_path / "out"), "--data", str(tmp_path)]) == 2
    assert "chat.jsonl: missing" in capsys.readouterr().err
