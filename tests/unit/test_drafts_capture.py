"""``specgate drafts train --from-capture``: the gateway's captured prompts as the pipeline's
prompts JSONL (conversion per endpoint, dedupe, task filter, bad lines named by file:line)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from backends.drafts import train_run
from backends.drafts.from_capture import convert_capture, parse_tasks, to_prompts
from backends.drafts.hf_stages import _read_prompts
from cli.main import main
from contracts.capture_store import CaptureStore

HI = [{"role": "user", "content": "hi"}]


def record(task: str, endpoint: str, **prompt: Any) -> dict[str, Any]:
    return {"ts": "2026-12-01T10:00:00.000Z", "endpoint": endpoint, "task": task, **prompt}


def chat(task: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return record(task, "/v1/chat/completions", messages=messages)


def capture(root: Path, records: list[dict[str, Any]]) -> None:
    """Write ``records`` as the gateway would, one file per task."""
    store = CaptureStore(root, max_bytes=1 << 20, max_file_bytes=1 << 16)
    store.begin()
    for item in records:
        store.append(item["task"], (json.dumps(item) + "\n").encode())


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config whose plain local backend names a (config-only) target folder."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 32}))
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "backends:\n  plain:\n    url: http://127.0.0.1:9\n    local: true\n"
        f"    profile: {{model: {target}, served_model_name: m, port: 9}}\n"
        "pools: {plain: [plain]}\ndefaults: {pool: plain}\n"
        f"capture: {{dir: {tmp_path / 'configured'}}}\n"
    )
    return path


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Stand-in for the training stages: records what they were given."""
    calls: list[Any] = []
    monkeypatch.setattr(train_run, "run_stages", lambda args, target, plan, log: calls.append(args))
    return calls


def test_each_endpoint_becomes_chat_messages() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    assert to_prompts(chat("chat", [{"role": "developer", "content": "be brief"}, *HI])) == [
        [{"role": "system", "content": "be brief"}, *HI]
    ]
    assert to_prompts(chat("chat", [{"role": "user", "content": parts}])) == [
        [{"role": "user", "content": "a\nb"}]
    ]
    completions = record("code", "/v1/completions", prompt=["def f():", "", "class A:"])
    assert to_prompts(completions) == [
        [{"role": "user", "content": "def f():"}],
        [{"role": "user", "content": "class A:"}],
    ]
    assert to_prompts(record("code", "/v1/completions", prompt=[1, 2, 3])) == []
    responses = record(
        "chat",
        "/v1/responses",
        instructions="sys",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
            {"type": "function_call_output", "output": "42"},
        ],
    )
    assert to_prompts(responses) == [
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    ]
    messages = record("rag", "/v1/messages", system=[{"type": "text", "text": "s"}], messages=HI)
    assert to_prompts(messages) == [[{"role": "system", "content": "s"}, *HI]]
    tool_only = chat("chat", [{"role": "system", "content": "s"}, {"role": "tool", "content": "x"}])
    assert to_prompts(tool_only) == []


def test_conversion_dedupes_filters_tasks_and_reads_oldest_first(tmp_path: Path) -> None:
    root = tmp_path / "cap"
    code = record("code", "/v1/completions", prompt="def fib(n):")
    capture(
        root,
        [
            chat("chat", HI),
            code,
            chat("chat", HI),  # the same prompt again
            chat("rag", [{"role": "user", "content": "Given the passage..."}]),
            record("code", "/v1/completions", prompt=[[1, 2]]),
            code,
        ],
    )
    found = convert_capture(root, parse_tasks("code,chat"))
    assert [p["messages"] for p in found.prompts] == [
        HI,
        [{"role": "user", "content": "def fib(n):"}],
    ]
    assert found.duplicates == 2 and found.skipped == {"token ids": 1}
    assert len({p["id"] for p in found.prompts}) == 2
    assert convert_capture(root, ("rag",)).prompts[0]["messages"][0]["content"].startswith("Given")
    again = convert_capture(root, parse_tasks(None))
    assert {p["id"] for p in found.prompts} <= {p["id"] for p in again.prompts}  # stable ids


def test_train_from_capture_writes_prompts_the_pipeline_reads(
    tmp_path: Path, config: Path, trained: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "cap"
    capture(root, [chat("chat", HI), chat("chat", HI), chat("creative", HI), chat("code", HI)])
    out = tmp_path / "head"
    argv = ["drafts", "train", "--config", str(config), "--out", str(out), "--no-gate"]
    assert main([*argv, "--from-capture", str(root), "--tasks", "chat,code"]) == 0
    [args] = trained
    assert args.prompts == tmp_path / "head.work" / "capture-prompts.jsonl"
    assert [m for _, m in _read_prompts(args.prompts)] == [HI]
    assert stat.S_IMODE(args.prompts.stat().st_mode) == 0o600
    said = capsys.readouterr().out
    assert "3 records, 1 distinct prompts (2 duplicates)" in said
    assert "1 prompts, about" in said


def test_from_capture_without_dir_reads_the_configs_capture_dir(
    tmp_path: Path, config: Path, trained: list[Any]
) -> None:
    capture(tmp_path / "configured", [chat("rag", HI)])
    argv = ["drafts", "train", "--config", str(config), "--out", str(tmp_path / "h")]
    assert main([*argv, "--no-gate", "--from-capture"]) == 0
    assert [m for _, m in _read_prompts(trained[0].prompts)] == [HI]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("not json", "bad capture line: Expecting value"),
        ('["a"]', "not a JSON object"),
        ('{"endpoint": "/v1/completions", "task": "poetry", "prompt": "x"}', "task 'poetry'"),
        ('{"endpoint": "/v1/embeddings", "task": "chat", "input": "x"}', "not a routed endpoint"),
        ('{"endpoint": "/v1/chat/completions", "task": "chat"}', "no prompt field (messages)"),
        ('{"endpoint": "/v1/chat/completions", "task": "chat", "messages": "hi"}', "is a str"),
    ],
)
def test_a_bad_line_is_refused_with_its_file_and_line(
    tmp_path: Path,
    config: Path,
    trained: list[Any],
    capsys: pytest.CaptureFixture[str],
    line: str,
    problem: str,
) -> None:
    root = tmp_path / "cap"
    capture(root, [chat("chat", HI)])
    [path] = root.iterdir()
    with path.open("a") as handle:
        handle.write(line + "\n")
    out = tmp_path / "head"
    argv = ["drafts", "train", "--config", str(config), "--out", str(out)]
    assert main([*argv, "--from-capture", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: bad capture line" in err and problem in err
    assert trained == [] and not out.with_name("head.work").exists()


def test_a_line_being_written_is_left_for_later(tmp_path: Path) -> None:
    root = tmp_path / "cap"
    capture(root, [chat("chat", HI)])
    [path] = root.iterdir()
    with path.open("a") as handle:
        handle.write('{"endpoint": "/v1/chat/compl')  # no newline yet
    assert len(convert_capture(root, ("chat",)).prompts) == 1


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (["--from-capture", "{cap}", "--tasks", "code,poetry"], "--tasks 'code,poetry'"),
        (["--prompts", "{cap}/p.jsonl", "--tasks", "code"], "--tasks goes with --from-capture"),
        (["--from-capture", "{cap}/missing"], "no capture directory"),
        (["--from-capture", "{cap}", "--tasks", "rag"], "no captured prompts for rag"),
    ],
)
def test_unusable_capture_options_are_refused(
    tmp_path: Path,
    config: Path,
    trained: list[Any],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    problem: str,
) -> None:
    root = tmp_path / "cap"
    capture(root, [chat("chat", HI)])
    argv = ["drafts", "train", "--config", str(config), "--out", str(tmp_path / "h")]
    assert main([*argv, *(a.format(cap=root) for a in extra)]) == 2
    assert problem in capsys.readouterr().err
    assert trained == []


def test_prompts_and_from_capture_exclude_each_other(tmp_path: Path, config: Path) -> None:
    argv = ["drafts", "train", "--config", str(config), "--out", str(tmp_path / "h")]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--prompts", "p.jsonl", "--from-capture", "d"])
    assert exit_.value.code == 2
