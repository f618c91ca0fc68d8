"""``specgate drafts train --engine vllm``'s distill stage against the fake vLLM server (real
sockets): the rows, their sampling, resume, and the servers it refuses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.drafts.hf_stages import _done_ids, _sampled
from backends.drafts.vllm_distill import (
    CHECK_TEXT,
    DistillError,
    DistillSettings,
    ServerMismatch,
    distill_from,
)
from cli.main import main
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.fake_vllm_extra import fake_token_id, fake_words
from tests.fakes.servers import free_port, running_server

SETTINGS = DistillSettings(max_new_tokens=4, concurrency=3)


@pytest.fixture
def fake() -> FakeBehaviour:
    return FakeBehaviour(model="m", tokens=6, tokenizer=True)


@pytest.fixture
def url(fake: FakeBehaviour) -> Iterator[str]:
    with running_server(create_fake_vllm(fake)) as base:
        yield base


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A target folder whose tokenizer.json maps the check text's words as the fake does."""
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 50000}))
    vocab = {w: fake_token_id(w) for w in CHECK_TEXT.split()}
    tokenizer = {"model": {"type": "BPE", "vocab": vocab}, "added_tokens": []}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def write_prompts(path: Path, n: int) -> list[list[dict[str, str]]]:
    chats = [[{"role": "user", "content": f"question {i} about things"}] for i in range(n)]
    path.write_text(
        "".join(json.dumps({"id": f"p{i}", "messages": m}) + "\n" for i, m in enumerate(chats))
    )
    return chats


def run(url: str, target: Path, prompts: Path, out: Path, **kw: object) -> dict[str, object]:
    settings = DistillSettings(**{**SETTINGS.__dict__, **kw})
    return asyncio.run(distill_from(url, target, "m", prompts, out, settings, log=lambda _: None))


def test_rows_are_prompt_ids_then_answer_ids(
    url: str, target: Path, tmp_path: Path, fake: FakeBehaviour
) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "rows.jsonl"
    chats = write_prompts(prompts, 6)
    summary = run(url, target, prompts, out)
    assert summary["answered"] == 6
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == [f"p{i}" for i in range(6)]
    for i, chat in enumerate(chats):
        body = {"messages": chat, "add_generation_prompt": True}
        prompt = [fake_token_id(w) for w in fake_words(body)]
        answer = prompt[::-1][:4]  # the fake's answer, capped at max_new_tokens
        row = rows[f"p{i}"]
        assert row["input_ids"] == prompt + answer
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(answer)
    sent = [json.loads(r["body"]) for r in fake.received if r["path"] == "/v1/completions"]
    assert all(b["return_token_ids"] and b["model"] == "m" and b["max_tokens"] == 4 for b in sent)
    for b in sent:  # the transformers engine's choice: half sampled at 0.7 / 0.95, half greedy
        item = next(k for k, r in rows.items() if r["input_ids"][: len(b["prompt"])] == b["prompt"])
        expected = (0.7, 0.95) if _sampled(item, 0.5) else (0.0, 1.0)
        assert (b["temperature"], b["top_p"]) == expected
    tokenized = [json.loads(r["body"]) for r in fake.received if r["path"] == "/tokenize"]
    assert all(b.get("add_generation_prompt") for b in tokenized if "messages" in b)


def test_a_rerun_skips_written_rows_and_cuts_a_torn_line(
    url: str, target: Path, tmp_path: Path, fake: FakeBehaviour
) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "rows.jsonl"
    write_prompts(prompts, 5)
    run(url, target, prompts, out, limit=2)
    assert _done_ids(out) == {"p0", "p1"}
    first = out.read_text()
    with out.open("a") as handle:
        handle.write('{"id": "p2", "input_ids": [1, 2')  # killed mid-write
    fake.received.clear()
    run(url, target, prompts, out)
    lines = out.read_text().splitlines()
    assert out.read_text().startswith(first) and len(lines) == 5
    assert sorted(json.loads(line)["id"] for line in lines) == [f"p{i}" for i in range(5)]
    assert sum(r["path"] == "/v1/completions" for r in fake.received) == 3
    fake.received.clear()
    run(url, target, prompts, out)  # all done: nothing asked
    assert [r for r in fake.received if r["path"] == "/v1/completions"] == []


def test_prompts_too_long_are_skipped(url: str, target: Path, tmp_path: Path) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "rows.jsonl"
    write_prompts(prompts, 2)
    summary = run(url, target, prompts, out, max_prompt_tokens=3)
    assert summary["skipped_too_long"] == 2 and out.read_text() == ""


def test_a_server_of_another_model_is_refused_before_any_write(
    url: str, target: Path, tmp_path: Path, fake: FakeBehaviour
) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "rows.jsonl"
    write_prompts(prompts, 2)
    fake.token_offset = 7  # same names, another tokenizer
    with pytest.raises(ServerMismatch, match="tokenizer is not the target's"):
        run(url, target, prompts, out)
    assert not out.exists()
    fake.token_offset, fake.model = 0, "other"
    run(url, target, prompts, out)  # the only model served, its tokenizer the target's
    assert len(out.read_text().splitlines()) == 2


def test_an_unreachable_or_bad_url_is_a_clear_error(target: Path, tmp_path: Path) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "rows.jsonl"
    write_prompts(prompts, 1)
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(DistillError, match=rf"{dead}/v1/models: ConnectError"):
        run(dead, target, prompts, out)
    with pytest.raises(DistillError, match="expected a URL like http://HOST:PORT"):
        run("localhost:8000", target, prompts, out)
    for bad in ("http://127.0.0.1:99999", "http://:8000", "http://[::1"):
        with pytest.raises(DistillError, match="expected a URL like http://HOST:PORT"):
            run(bad, target, prompts, out)
    assert not out.exists()


def test_a_failing_request_stops_the_stage_with_the_status(
    url: str, target: Path, tmp_path: Path, fake: FakeBehaviour
) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "rows.jsonl"
    write_prompts(prompts, 3)
    fake.status = 500  # generation fails; /tokenize and /v1/models still answer
    with pytest.raises(DistillError, match="v1/completions: HTTP 500"):
        run(url, target, prompts, out)
    assert out.read_text() == ""


@pytest.fixture
def config(target: Path, tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "backends:\n  plain:\n    url: http://127.0.0.1:9\n    local: true\n"
        f"    profile: {{model: {target}, served_model_name: m, port: 9}}\n"
        "pools: {plain: [plain]}\ndefaults: {pool: plain}\n"
    )
    return path


def test_train_refuses_a_wrong_server_before_anything_starts(
    url: str, config: Path, tmp_path: Path, fake: FakeBehaviour, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "head"
    write_prompts(prompts, 2)
    argv = ["drafts", "train", "--config", str(config), "--prompts", str(prompts)]
    argv += ["--out", str(out), "--no-gate"]
    fake.token_offset = 1
    assert main([*argv, "--engine", "vllm", "--server", url]) == 2
    assert "tokenizer is not the target's" in capsys.readouterr().err
    assert main([*argv, "--engine", "vllm", "--server", "http://127.0.0.1:1"]) == 2
    assert "ConnectError" in capsys.readouterr().err
    assert main([*argv, "--server", url]) == 2  # the transformers engine takes no server
    assert "--server goes with --engine vllm" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "head.work").exists()


def test_a_bad_whole_row_is_named_not_appended_to(target: Path, tmp_path: Path, url: str) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "rows.jsonl"
    write_prompts(prompts, 1)
    out.write_text("not json\n")
    with pytest.raises(DistillError, match=r"rows\.jsonl:1: bad row"):
        run(url, target, prompts, out)
    assert out.read_text() == "not json\n"
