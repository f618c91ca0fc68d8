"""Pre-launch checks: vocabulary, draft TP, EAGLE heads, MTP, GPU collisions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backends.checks import ModelLookup, Problem, check_backends, check_profiles
from backends.model_info import KNOWN_MODELS
from contracts.config import load_config
from contracts.launch_profile import BackendProfile, Speculation

ROOT = Path(__file__).resolve().parents[2]
L8B, L1B = "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.fixture
def lookup(tmp_path: Path) -> ModelLookup:
    return ModelLookup(hub_cache=tmp_path / "empty-hub")


def profile(model: str = L8B, **fields: Any) -> BackendProfile:
    return BackendProfile(model=model, served_model_name="m", port=8000, **fields)


def spec(method: str, model: str | None = None, **fields: Any) -> Speculation:
    return Speculation(method=method, model=model, num_speculative_tokens=3, **fields)  # type: ignore[arg-type]


def found(problems: list[Problem]) -> list[tuple[str, str, str]]:
    return [(p.backend, p.field, p.severity) for p in problems]


def write_model(folder: Path, config: dict[str, Any], vocab: dict[str, int] | None = None) -> str:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if vocab is not None:
        tokenizer = {"model": {"type": "BPE", "vocab": vocab}, "added_tokens": []}
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return str(folder)


def test_same_family_draft_passes(lookup: ModelLookup) -> None:
    p = profile(speculation=spec("draft_model", L1B, draft_tensor_parallel_size=1))
    assert check_profiles({"draft": p}, lookup) == []


def test_other_family_draft_is_refused_unless_allowed(lookup: ModelLookup) -> None:
    p = profile(speculation=spec("draft_model", QWEN))
    (problem,) = check_profiles({"draft": p}, lookup)
    assert found([problem]) == [("draft", "speculation.model", "error")]
    assert "vocab_size 151936 (qwen2) differs from the target's 128256 (llama)" in problem.message
    assert "30% acceptance" in problem.message and "allow_vocab_mismatch" in problem.message
    assert str(problem).startswith("error: backends.draft.profile.speculation.model: draft ")
    allowed = p.model_copy(update={"allow_vocab_mismatch": True})
    assert found(check_profiles({"draft": allowed}, lookup)) == [
        ("draft", "speculation.model", "warning")
    ]


def test_tokenizers_compared_when_both_are_local(tmp_path: Path, lookup: ModelLookup) -> None:
    config = KNOWN_MODELS["meta-llama/llama-3.2-1b"] | {"vocab_size": 3}
    target = write_model(tmp_path / "t", config, {"a": 0, "b": 1, "c": 2})
    same = write_model(tmp_path / "same", config, {"a": 0, "b": 1, "c": 2})
    other = write_model(tmp_path / "other", config, {"a": 0, "c": 1, "b": 2})
    bare = write_model(tmp_path / "bare", config)
    assert check_profiles({"d": profile(target, speculation=spec("draft_model", same))}) == []
    assert check_profiles({"d": profile(target, speculation=spec("draft_model", bare))}) == []
    (problem,) = check_profiles({"d": profile(target, speculation=spec("draft_model", other))})
    assert (
        problem.severity == "error" and "tokenizers map tokens to different ids" in problem.message
    )


def test_unknown_draft_is_a_warning(lookup: ModelLookup) -> None:
    p = profile(speculation=spec("draft_model", "org/mystery-draft"))
    (problem,) = check_profiles({"d": p}, lookup)
    assert problem.severity == "warning" and "org/mystery-draft" in problem.message


@pytest.mark.parametrize(
    ("tp", "draft_tp", "ok"), [(4, 1, True), (4, 4, True), (4, 2, False), (1, 2, False)]
)
def test_draft_tensor_parallel_is_1_or_the_targets(
    tp: int, draft_tp: int, ok: bool, lookup: ModelLookup
) -> None:
    p = profile(
        tensor_parallel_size=tp,
        speculation=spec("draft_model", L1B, draft_tensor_parallel_size=draft_tp),
    )
    expected = [] if ok else [("d", "speculation.draft_tensor_parallel_size", "error")]
    assert found(check_profiles({"d": p}, lookup)) == expected


def test_eagle_heads(lookup: ModelLookup) -> None:
    right = profile(speculation=spec("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"))
    assert check_profiles({"e": right}, lookup) == []
    older = profile(speculation=spec("eagle", "yuhuili/EAGLE-LLaMA3-Instruct-8B"))
    (problem,) = check_profiles({"e": older}, lookup)
    assert found([problem]) == [("e", "speculation.model", "warning")]
    assert "trained for meta-llama/meta-llama-3-8b-instruct" in problem.message
    assert "yuhuili/eagle-llama3.1-instruct-8b" in problem.message  # the head to use instead
    wrong_method = profile(speculation=spec("eagle", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"))
    assert found(check_profiles({"e": wrong_method}, lookup)) == [
        ("e", "speculation.method", "error")
    ]
    wrong_target = profile(QWEN, speculation=spec("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"))
    problems = check_profiles({"e": wrong_target}, lookup)
    assert (
        found(problems)
        == [("e", "speculation.model", "warning")] + [("e", "speculation.model", "error")] * 2
    )  # hidden size 4096 vs 896, vocab 128256 vs 151936


def test_eagle_head_config_read_locally(tmp_path: Path, lookup: ModelLookup) -> None:
    head = write_model(
        tmp_path / "my-eagle-head",
        {"model_type": "llama", "hidden_size": 2048, "vocab_size": 128256},
    )
    (problem,) = check_profiles({"e": profile(speculation=spec("eagle", head))}, lookup)
    assert problem.severity == "error"
    assert "hidden_size 2048 does not match the target's 4096" in problem.message
    unknown = profile(speculation=spec("eagle", "org/some-eagle-head"))
    assert found(check_profiles({"e": unknown}, lookup)) == [("e", "speculation.model", "warning")]


def test_mtp_needs_built_in_layers(tmp_path: Path, lookup: ModelLookup) -> None:
    (problem,) = check_profiles({"m": profile(speculation=spec("mtp"))}, lookup)
    assert found([problem]) == [("m", "speculation.method", "error")]
    assert "has no built-in MTP layers" in problem.message
    config = KNOWN_MODELS["meta-llama/llama-3.2-1b"] | {"num_nextn_predict_layers": 1}
    target = write_model(tmp_path / "with-mtp", config)
    assert check_profiles({"m": profile(target, speculation=spec("mtp"))}, lookup) == []
    unknown = profile("org/unknown", speculation=spec("mtp"))
    assert found(check_profiles({"m": unknown}, lookup)) == [("m", "speculation.method", "warning")]


def test_gpu_indices(lookup: ModelLookup) -> None:
    profiles = {
        "a": profile(gpus=[0, 1], tensor_parallel_size=2),
        "b": profile(gpus=[1]),
        "c": profile(gpus=[1], node="other"),
        "d": profile(gpus=[2], tensor_parallel_size=2),
        "e": profile(gpus=[3, 4]),
    }
    problems = check_profiles(profiles, lookup)
    assert found(problems) == [
        ("d", "gpus", "error"),
        ("e", "gpus", "warning"),
        ("b", "gpus", "error"),
    ]
    assert problems[-1].message == (
        "GPU 1 on node 'default' is also used by backend 'a' without a "
        "gpu_memory_utilization share (a, b)"
    )
    assert "lists 1 GPU(s) but tensor_parallel_size is 2" in problems[0].message


def test_one_gpu_shared_by_memory_shares(lookup: ModelLookup) -> None:
    """Four servers on one GPU (config/gpu-single.yaml) are fine while the shares fit."""
    fits = {n: profile(gpus=[0], gpu_memory_utilization=0.2) for n in "abcd"}
    problems = check_profiles(fits, lookup)
    assert [p for p in problems if p.field == "gpus"] == []
    race = [p for p in problems if p.field == "extra_args"]
    assert [(p.backend, p.severity) for p in race] == [(n, "warning") for n in "abcd"]
    assert "No available memory for the cache blocks" in race[0].message
    fixed = {
        n: profile(
            gpus=[0], gpu_memory_utilization=0.2, extra_args=["--kv-cache-memory-bytes", "6G"]
        )
        for n in "abcd"
    }
    assert [p for p in check_profiles(fixed, lookup) if p.field in ("gpus", "extra_args")] == []
    over = {n: profile(gpus=[0], gpu_memory_utilization=0.3) for n in "abcd"}
    problems = [p for p in check_profiles(over, lookup) if p.field == "gpus"]
    assert [(p.backend, p.severity) for p in problems] == [
        ("b", "error"),
        ("c", "error"),
        ("d", "error"),
    ]
    assert problems[0].message == (
        "GPU 0 on node 'default' is also used by backend 'a' with gpu_memory_utilization "
        "summing to 1.2 > 1"
    )


def test_check_backends_on_the_shipped_configs() -> None:
    for name in ("production.example.yaml", "local.yaml", "gpu-single.yaml"):
        problems = check_backends(load_config(ROOT / "config" / name))
        assert [p for p in problems if p.severity == "error"] == [], name
