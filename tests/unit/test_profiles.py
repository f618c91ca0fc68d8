"""The example profiles in backends/profiles/: each loads, renders its argv, passes checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from backends.checks import ModelLookup, check_profiles
from backends.plan import plan_profiles
from cli.backends import load_profile
from contracts.launch_profile import BackendProfile, build_argv, build_serve_args
from contracts.paths import CachePaths

PROFILES = Path(__file__).resolve().parents[2] / "backends" / "profiles"
L8B = "meta-llama/Llama-3.1-8B-Instruct"
SERVER = ["python", "-m", "vllm.entrypoints.openai.api_server"]


def common(model: str = L8B, name: str = "llama-3.1-8b-instruct") -> list[str]:
    return [*SERVER, "--model", model, "--served-model-name", name]


HOST = ["--host", "0.0.0.0", "--port", "8000", "--dtype", "bfloat16"]
LLAMA = ["--gpu-memory-utilization", "0.9", "--max-model-len", "8192"]

#: Expected argv and CUDA_VISIBLE_DEVICES of every profile file, by file name.
EXPECTED: dict[str, tuple[list[str], str]] = {
    "plain": ([*common(), *HOST, *LLAMA], "0"),
    "ngram": (
        [*common(), *HOST, *LLAMA, "--speculative-config",
         '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,'
         '"prompt_lookup_min":2}'],
        "1",
    ),
    "draft_model": (
        [*common(), *HOST, "--gpu-memory-utilization", "0.95", "--max-model-len", "8192",
         "--speculative-config",
         '{"method":"draft_model","draft_tensor_parallel_size":1,'
         '"model":"meta-llama/Llama-3.2-1B-Instruct","num_speculative_tokens":5,'
         '"quantization":"fp8"}'],
        "0",
    ),
    "eagle": (
        [*common(), *HOST, *LLAMA, "--speculative-config",
         '{"method":"eagle","draft_tensor_parallel_size":1,'
         '"model":"yuhuili/EAGLE-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}'],
        "3",
    ),
    "eagle3": (
        [*common(), *HOST, *LLAMA, "--speculative-config",
         '{"method":"eagle3","draft_tensor_parallel_size":1,'
         '"model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":4}'],
        "4",
    ),
    "mtp": (
        [*common("Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b-instruct"), *HOST,
         "--tensor-parallel-size", "4", "--gpu-memory-utilization", "0.9",
         "--max-model-len", "32768", "--speculative-config",
         '{"method":"mtp","num_speculative_tokens":2}'],
        "0,1,2,3",
    ),
    "tensor_parallel": (
        [*common("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b-instruct"), *HOST,
         "--tensor-parallel-size", "4", "--gpu-memory-utilization", "0.9",
         "--max-model-len", "16384", "--speculative-config",
         '{"method":"draft_model","draft_tensor_parallel_size":1,'
         '"model":"meta-llama/Llama-3.2-1B-Instruct","num_speculative_tokens":4}'],
        "0,1,2,3",
    ),
}  # fmt: skip


def load_all() -> dict[str, BackendProfile]:
    return {path.stem: load_profile(path) for path in sorted(PROFILES.glob("*.yaml"))}


def test_every_profile_file_renders_its_argv() -> None:
    profiles = load_all()
    assert set(profiles) == set(EXPECTED)
    for name, profile in profiles.items():
        argv, devices = EXPECTED[name]
        assert build_argv(profile) == argv, name
        assert profile.launch_env == {"CUDA_VISIBLE_DEVICES": devices}, name
        assert build_serve_args(profile) == [profile.model, *argv[5:]], name


def test_profiles_cover_every_kind() -> None:
    profiles = load_all().values()
    methods = {p.speculation.method for p in profiles}
    assert methods >= {"none", "ngram", "draft_model", "eagle", "eagle3", "mtp"}
    assert any((p.tensor_parallel_size or 1) > 1 for p in profiles)
    assert any(p.speculation.quantization for p in profiles)
    assert all(p.gpu_memory_utilization and p.gpus for p in profiles)


def test_profiles_pass_checks_and_fit(tmp_path: Path) -> None:
    lookup = ModelLookup(hub_cache=tmp_path)
    profiles = load_all()
    assert [p for p in check_profiles(profiles, lookup) if p.severity == "error"] == []
    plan = plan_profiles(profiles, paths=CachePaths(tmp_path), lookup=lookup)
    assert plan.errors == []
    for backend in plan.backends:
        if backend.memory is not None:
            assert backend.memory.need_gib <= backend.memory.budget_gib, backend.name


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": [0, 0]}, "GPU indices repeat"),
        ({"gpus": [-1]}, "GPU indices are >= 0"),
        ({"gpus": []}, "at least 1 item"),
        ({"gpu_memory_gb": 0}, "greater than 0"),
        ({"expected_concurrency": 0}, "greater than or equal to 1"),
    ],
)
def test_invalid_deployment_fields(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BackendProfile(model="m", served_model_name="s", port=8000, **fields)  # type: ignore[arg-type]


def test_quantization_flag_and_env_precedence() -> None:
    p = BackendProfile(
        model="m",
        served_model_name="s",
        port=8000,
        quantization="awq",
        gpus=[1],
        env={"CUDA_VISIBLE_DEVICES": "7", "X": "1"},
    )
    assert build_argv(p)[-2:] == ["--quantization", "awq"]
    assert p.launch_env == {"CUDA_VISIBLE_DEVICES": "7", "X": "1"}
