"""``specgate drafts train --engine vllm``'s distill stage on a real vLLM CPU server.

The server is the one the command starts when no ``--server`` is given (the config's plain
profile on a free port); 3 prompts (2 greedy, 1 sampled), 16 new tokens. The rows must be the
server's own chat-template tokens followed by its answer: greedy rows decode to the server's
greedy chat answer. About a minute on 2 cores, most of it the server's start.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import pytest

from backends.drafts.hf_stages import _sampled
from backends.drafts.pipeline import plain_profile
from backends.drafts.train_run import distill_on_vllm, started_server
from backends.launcher import _port_open
from backends.vllm_env import is_vllm_env_ready
from cli.drafts import DEFAULT_CONFIG
from contracts.paths import CachePaths

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tests" / "data" / "drafts" / "smoke_prompts.jsonl"
IDS = ("smoke-00", "smoke-05", "smoke-06")


def test_rows_decode_to_the_servers_answers(tmp_path: Path) -> None:
    paths = CachePaths.default()
    if not is_vllm_env_ready(paths):
        pytest.skip("the vLLM venv is not ready (specgate up builds it)")
    items = [json.loads(line) for line in SMOKE.read_text().splitlines()]
    chosen = {item["id"]: item["messages"] for item in items if item["id"] in IDS}
    prompts, rows = tmp_path / "prompts.jsonl", tmp_path / "rows.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": k, "messages": m}) + "\n" for k, m in chosen.items())
    )
    assert [_sampled(k, 0.5) for k in IDS] == [True, False, False]
    profile = plain_profile(DEFAULT_CONFIG)
    args = argparse.Namespace(
        config=DEFAULT_CONFIG, prompts=prompts, max_new_tokens=16, max_samples=0, concurrency=3
    )
    lines: list[str] = []
    with started_server(profile, paths.vllm_python, paths, lines.append) as url:
        distill_on_vllm(
            argparse.Namespace(**vars(args), server=url),
            Path(profile.model),
            rows,
            paths.vllm_python,
            paths,
            lines.append,
        )
        written = {r["id"]: r for r in map(json.loads, rows.read_text().splitlines())}
        assert sorted(written) == sorted(IDS)
        with httpx.Client(base_url=url, timeout=120) as http:
            for item_id, messages in chosen.items():
                row = written[item_id]
                body = {"model": profile.served_model_name, "messages": messages}
                prompt = http.post("/tokenize", json=body | {"add_generation_prompt": True})
                prompt_ids = prompt.json()["tokens"]
                n = len(prompt_ids)
                assert row["input_ids"][:n] == prompt_ids
                assert row["loss_mask"] == [0] * n + [1] * (len(row["input_ids"]) - n)
                answer = row["input_ids"][n:]
                assert 1 <= len(answer) <= 16
                if _sampled(item_id, 0.5):
                    continue
                text = http.post("/detokenize", json={"tokens": answer}).json()["prompt"]
                chat = http.post(
                    "/v1/chat/completions", json=body | {"temperature": 0, "max_tokens": 16}
                ).json()
                expected = chat["choices"][0]["message"]["content"]
                assert text.removesuffix("<|im_end|>") == expected, (item_id, text, expected)
                assert chat["usage"]["completion_tokens"] == len(answer)
    assert not _port_open("127.0.0.1", httpx.URL(url).port or 0)  # stopped at the end
    assert any("healthy after" in line for line in lines) and lines[-1] == "[distill-plain] stopped"
