"""Model facts (config.json, HF cache, table, safetensors), memory estimates, plan output."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from backends.checks import ModelLookup
from backends.memory import GIB, estimate_memory
from backends.model_info import (
    KNOWN_MODELS,
    bytes_per_parameter,
    count_parameters,
    find_model_dir,
    load_model_info,
    safetensors_parameters,
)
from backends.plan import plan_profiles, render_plan
from cli.main import main
from contracts.launch_profile import BackendProfile, Speculation
from contracts.paths import CachePaths

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2_DIR = Path("/root/.cache/specgate/models/smollm2-135m-instruct")
L8B, L1B = "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"

#: SmolLM2-135M-Instruct's real config.json (architecture fields).
SMOLLM2_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True,
    "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
}  # fmt: skip


@pytest.fixture
def lookup(tmp_path: Path) -> ModelLookup:
    """Model facts from an empty HF cache: only the built-in table (or explicit folders)."""
    return ModelLookup(hub_cache=tmp_path / "empty-hub")


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("SPECGATE_CACHE_DIR", str(tmp_path / "specgate"))


def write_model(folder: Path, config: dict[str, Any], **files: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)
    return folder


def profile(**fields: Any) -> BackendProfile:
    base: dict[str, Any] = {"model": L8B, "served_model_name": "llama", "port": 8000}
    return BackendProfile(**(base | fields))


@pytest.mark.parametrize(
    ("model", "params"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248),
        ("meta-llama/Llama-3.1-70B-Instruct", 70_553_706_496),
        ("meta-llama/Llama-3.2-1B-Instruct", 1_235_814_400),
        ("meta-llama/Llama-3.2-3B-Instruct", 3_212_749_824),
        ("Qwen/Qwen2.5-0.5B-Instruct", 494_032_768),
        ("Qwen/Qwen2.5-7B-Instruct", 7_615_616_512),
        ("mistralai/Mistral-7B-Instruct-v0.3", 7_248_023_552),
    ],
)
def test_table_parameter_counts_match_published_totals(
    model: str, params: int, tmp_path: Path
) -> None:
    info = load_model_info(model, hub_cache=tmp_path)
    assert info is not None and info.source == "built-in table"
    assert info.num_parameters == params


def test_kv_bytes_per_token_from_architecture(tmp_path: Path) -> None:
    llama8b = load_model_info(L8B, hub_cache=tmp_path)
    assert llama8b is not None
    assert llama8b.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert llama8b.kv_bytes_per_token(2, tensor_parallel=4) == 32 * 1024
    assert llama8b.kv_bytes_per_token(2, tensor_parallel=16) == 16 * 1024  # one head per GPU


def test_smollm2_config_in_tmp_path(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "smollm2", SMOLLM2_CONFIG)
    info = load_model_info(str(folder))
    assert info is not None and info.folder == folder
    assert info.num_parameters == 134_515_008  # tied embeddings: no separate LM head
    assert info.kv_bytes_per_token(2) == 2 * 30 * 3 * 64 * 2
    assert "formula" in info.source


@pytest.mark.skipif(not SMOLLM2_DIR.is_dir(), reason="local SmolLM2 folder not prepared")
def test_real_smollm2_folder_counts_safetensors() -> None:
    info = load_model_info(str(SMOLLM2_DIR))
    assert info is not None and "safetensors" in info.source
    assert info.num_parameters == count_parameters(info.config) == 134_515_008
    assert info.kv_bytes_per_token(4) == 2 * 30 * 3 * 64 * 4


def test_safetensors_header_counts_elements(tmp_path: Path) -> None:
    header = {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F16", "shape": [4, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "F16", "shape": [5], "data_offsets": [24, 34]},
    }
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(34))
    assert safetensors_parameters(tmp_path) == 17
    assert safetensors_parameters(tmp_path / "missing") is None


def test_hf_cache_snapshot_wins_over_the_table(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct"
    write_model(
        repo / "snapshots" / "rev1", KNOWN_MODELS["meta-llama/llama-3.1-8b"] | {"vocab_size": 1000}
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev1\n")
    assert find_model_dir(L8B, tmp_path / "hub") == repo / "snapshots" / "rev1"
    info = load_model_info(L8B, hub_cache=tmp_path / "hub")
    assert info is not None and info.vocab_size == 1000 and "config.json at" in info.source


def test_hf_home_default_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    snap = tmp_path / "hf" / "hub" / "models--Org--Small" / "snapshots" / "x"
    write_model(snap, SMOLLM2_CONFIG)
    assert find_model_dir("Org/Small") == snap
    assert find_model_dir("Org/Other") is None
    assert load_model_info("Org/Other") is None


def test_bytes_per_parameter() -> None:
    assert bytes_per_parameter("float16", None) == (2.0, "float16")
    assert bytes_per_parameter("float32", None)[0] == 4.0
    assert bytes_per_parameter(None, "fp8") == (1.0, "fp8")
    assert bytes_per_parameter("bfloat16", "awq")[0] == 0.5
    assert "unknown" in bytes_per_parameter("bfloat16", "weird")[1]


def test_plan_8b_target_with_1b_draft_in_fp16_is_about_22_gib(lookup: ModelLookup) -> None:
    """The sanity anchor: 8B target ~15 GiB + 1B draft ~2.3 GiB + KV ~5 GiB fits 24 GiB.

    KV: Llama-3.1-8B stores 128 KiB/token in fp16; 8192 context x 4 sequences = 32k tokens
    = 4 GiB, plus the draft's own 32 KiB/token = 1 GiB.
    """
    p = profile(
        dtype="float16",
        max_model_len=8192,
        expected_concurrency=4,
        gpu_memory_gb=24,
        gpu_memory_utilization=0.95,
        speculation=Speculation(method="draft_model", model=L1B, num_speculative_tokens=5),
    )
    memory, problems = estimate_memory("draft", p, lookup)
    assert memory is not None and problems == []
    got = {line.label: round(line.gib, 2) for line in memory.lines}
    assert got == {
        "target weights": 14.96,  # 8,030,261,248 x 2 B
        "draft weights": 2.30,  # 1,235,814,400 x 2 B
        "KV cache target": 4.00,
        "KV cache draft": 1.00,
    }
    assert 21.5 < memory.need_gib < 23.0  # ~22 GiB (23.9 GB)
    assert memory.budget_gib == pytest.approx(22.8)
    text = render_plan(plan_profiles({"draft": p}, lookup=lookup))
    assert (
        "total              22.26   of 22.80 = 24 GiB x gpu_memory_utilization 0.95: fits" in text
    )
    tight = p.model_copy(update={"gpu_memory_utilization": 0.9})
    memory, problems = estimate_memory("draft", tight, lookup)
    assert [(x.field, x.severity) for x in problems] == [("expected_concurrency", "warning")]
    assert "3.5 sequences of 8,192 instead of 4" in problems[0].message


def test_memory_error_when_one_sequence_cannot_fit(lookup: ModelLookup) -> None:
    p = profile(model="meta-llama/Llama-3.1-70B-Instruct", dtype="bfloat16", max_model_len=8192)
    memory, problems = estimate_memory("big", p, lookup, gpu_memory_gb=80)
    assert memory is not None and memory.lines[0].gib == pytest.approx(131.4, abs=0.1)
    assert [(x.field, x.severity) for x in problems] == [("max_model_len", "error")]
    split = p.model_copy(update={"tensor_parallel_size": 4})
    memory, problems = estimate_memory("big", split, lookup, gpu_memory_gb=80)
    assert memory is not None and problems == []
    assert memory.lines[0].gib == pytest.approx(131.4 / 4, abs=0.1)
    assert memory.kv_bytes_per_token == 2 * 80 * 2 * 128 * 2  # 8 KV heads / 4 GPUs


def test_memory_defaults_and_unknowns(lookup: ModelLookup) -> None:
    memory, problems = estimate_memory("p", profile(), lookup, concurrency=1)
    assert memory is not None and problems == []
    assert memory.context == 131072  # max_position_embeddings when max_model_len is unset
    assert memory.utilization == 0.9 and memory.gpu_memory_gib == 80
    memory, problems = estimate_memory("x", profile(model="Org/Unknown"), lookup)
    assert memory is None and [(x.field, x.severity) for x in problems] == [("model", "warning")]
    quant = profile(max_model_len=4096, quantization="fp8", extra_args=["--kv-cache-dtype", "fp8"])
    memory, _ = estimate_memory("q", quant, lookup)
    assert memory is not None
    assert memory.lines[0].gib == pytest.approx(8_030_261_248 / GIB)
    assert memory.kv_bytes_per_token == 64 * 1024


def test_plan_renders_command_gpus_memory(tmp_path: Path, lookup: ModelLookup) -> None:
    p = profile(
        gpus=[2, 3],
        tensor_parallel_size=2,
        max_model_len=8192,
        env={"A": "b c"},
        speculation=Speculation(method="ngram", num_speculative_tokens=3),
    )
    plan = plan_profiles({"ng": p}, paths=CachePaths(tmp_path), lookup=lookup)
    (backend,) = plan.backends
    assert backend.command.startswith(
        "CUDA_VISIBLE_DEVICES=2,3 A='b c' python -m vllm.entrypoints.openai.api_server --model "
    )
    assert """--speculative-config '{"method":"ngram","num_speculative_tokens":3}'""" in (
        backend.command
    )
    assert backend.gpus == "2,3 on node 'default'"
    text = render_plan(plan)
    assert "target weights" in text and "fits" in text
    assert "1 backend(s), 0 error(s), 0 warning(s)" in text


def test_plan_resolves_local_models(tmp_path: Path, lookup: ModelLookup) -> None:
    write_model(tmp_path / "models" / "smollm2-135m-instruct", SMOLLM2_CONFIG)
    p = profile(model="local:smollm2-135m-instruct", dtype="float32", max_model_len=2048)
    plan = plan_profiles({"p": p}, paths=CachePaths(tmp_path))
    (backend,) = plan.backends
    assert f"--model {tmp_path}/models/smollm2-135m-instruct" in backend.command
    assert backend.memory is not None
    assert backend.memory.lines[0].detail.startswith("0.13B params x 4 B (float32)")


def test_plan_never_opens_a_socket(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("plan tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    assert main(["backends", "plan", "--config", str(ROOT / "config/production.example.yaml")]) == 0
    out = capsys.readouterr().out
    assert "4 backend(s), 0 error(s)" in out
    assert "DOES NOT FIT" not in out


def test_cli_plan_exits_1_on_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {"model": L8B, "served_model_name": "l", "port": 8000, "gpus": [0]}
    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(json.dumps(data))
    assert main(["backends", "plan", "--profile", str(tmp_path / "a.yaml")]) == 0
    args = ["backends", "plan", "--profile", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]
    assert main(args) == 1
    assert "error: backends.b.profile.gpus: GPU 0 on node 'default'" in capsys.readouterr().out
    (tmp_path / "bad.yaml").write_text("model: x\n")
    assert main(["backends", "plan", "--profile", str(tmp_path / "bad.yaml")]) == 1
    assert "served_model_name: Field required" in capsys.readouterr().err


def test_fixed_kv_cache_and_expected_memory(lookup: ModelLookup) -> None:
    """``--kv-cache-memory-bytes`` fixes the KV line; ``expected`` adds the engine overhead
    measured on an H200 (config/gpu-single.yaml: plain measured 8.47 GiB in nvidia-smi)."""
    p = profile(
        dtype="float16",
        max_model_len=8192,
        gpu_memory_gb=80,
        extra_args=["--kv-cache-memory-bytes", "6G"],
    )
    memory, _ = estimate_memory("plain", p, lookup)
    assert memory is not None and memory.kv_fixed
    got = {line.label: round(line.gib, 2) for line in memory.lines}
    assert got == {"target weights": 14.96, "KV cache (fixed)": 6.0}
    assert "49,152 tokens = 6.0 sequences of 8,192" in memory.lines[1].detail  # 128 KiB/token
    assert memory.expected_gib == pytest.approx(memory.need_gib + 2.5)
    eager = p.model_copy(update={"extra_args": ["--enforce-eager", "--kv-cache-memory-bytes=6g"]})
    memory, _ = estimate_memory("plain", eager, lookup)
    assert memory is not None and memory.overhead_gib == 1.0
    assert round(memory.lines[1].gib, 3) == round(6e9 / GIB, 3)  # lowercase: powers of 1000
    text = render_plan(plan_profiles({"plain": p}, lookup=lookup))
    assert "expected" in text and "what nvidia-smi shows" in text


@pytest.mark.parametrize("size", ["abc", "1.5G", "-1", "0", "6GiB", "1e9"])
def test_kv_cache_size_vllm_would_refuse_is_an_error(lookup: ModelLookup, size: str) -> None:
    p = profile(dtype="float16", max_model_len=8192, extra_args=["--kv-cache-memory-bytes", size])
    _, problems = estimate_memory("plain", p, lookup)
    assert [(x.field, x.severity) for x in problems][:1] == [("extra_args", "error")]
    assert size in problems[0].message


def test_fixed_kv_cache_under_one_sequence_or_over_the_gpu(lookup: ModelLookup) -> None:
    small = profile(
        dtype="float16", max_model_len=8192, extra_args=["--kv-cache-memory-bytes", "512M"]
    )
    _, problems = estimate_memory("plain", small, lookup)
    assert "under one 8,192-token sequence" in problems[0].message  # 128 KiB/token: 4,096
    big = profile(
        dtype="float16",
        max_model_len=8192,
        gpu_memory_gb=24,
        extra_args=["--kv-cache-memory-bytes", "20G"],
    )
    _, problems = estimate_memory("plain", big, lookup)
    assert [(x.field, x.severity) for x in problems] == [("extra_args", "error")]
    assert "over the GPU's 24 GiB" in problems[0].message


def test_backends_sharing_a_gpu_are_summed(lookup: ModelLookup) -> None:
    """Each sharer fits alone, but four fixed 6 GiB caches of a 0.5B target (+ weights and
    the engine overhead, ~9.4 GiB each) do not fit one 24 GiB GPU together."""
    qwen = "Qwen/Qwen2.5-0.5B-Instruct"
    one = profile(
        model=qwen,
        dtype="bfloat16",
        max_model_len=4096,
        gpus=[0],
        gpu_memory_gb=24,
        gpu_memory_utilization=0.2,
        extra_args=["--kv-cache-memory-bytes", "6G"],
    )
    four = {n: one.model_copy(update={"port": 8000 + i}) for i, n in enumerate("abcd")}
    plan = plan_profiles(four, lookup=lookup)
    assert [b.memory and b.memory.expected_gib <= 24 for b in plan.backends] == [True] * 4
    [gpu] = plan.shared
    assert (gpu.node, gpu.gpu, [n for n, _ in gpu.parts]) == ("default", 0, list("abcd"))
    assert gpu.total_gib == pytest.approx(4 * plan.backends[0].memory.expected_gib)  # type: ignore[union-attr]
    assert gpu.total_gib > 24
    [problem] = [p for p in plan.errors if p.field == "gpus"]
    assert problem.backend == "d" and "over the GPU's 24 GiB" in problem.message
    assert "DOES NOT FIT" in render_plan(plan)

    # Two fixed caches and one sized by its share (0.2 x 24 = 4.8 GiB) fit together.
    mixed = {"a": four["a"], "b": four["b"]}
    mixed["c"] = four["c"].model_copy(update={"extra_args": []})
    plan = plan_profiles(mixed, lookup=lookup)
    [gpu] = plan.shared
    assert dict(gpu.parts)["c"] == pytest.approx(4.8)
    assert not [p for p in plan.errors if p.field == "gpus"]
    assert f"= {gpu.total_gib:.2f} of 24: fits" in render_plan(plan)


def test_shared_gpu_without_a_verdict(lookup: ModelLookup) -> None:
    """A sharer not estimated, or sharers assuming different GPU sizes, get no "fits"."""
    known = profile(gpus=[0], gpu_memory_utilization=0.3, gpu_memory_gb=80, max_model_len=8192)
    unknown = known.model_copy(update={"model": "someone/unknown-model", "port": 8001})
    plan = plan_profiles({"a": known, "unk": unknown}, lookup=lookup)
    text = render_plan(plan)
    assert "unk (not estimated)" in text and "no verdict: unk not estimated" in text
    big = known.model_copy(update={"gpu_memory_gb": 139.8, "port": 8002})
    plan = plan_profiles({"a": known, "big": big}, lookup=lookup)
    assert "no verdict: the sharers assume different GPU sizes" in render_plan(plan)
    assert [p.field for p in plan.errors] == ["gpu_memory_gb"]
    assert "different sizes (80 and 139.8 GiB)" in plan.errors[0].message


def test_cli_plan_bad_input_is_a_message_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {"model": L8B, "served_model_name": "l", "port": 8000}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "p.yaml").write_text(json.dumps(data))
    (tmp_path / "p.yaml").write_text(json.dumps(data | {"port": 8001}))
    # two files with one stem would be one backend: refused
    same_stem = [str(tmp_path / "p.yaml"), str(tmp_path / "x" / "p.yaml")]
    assert main(["backends", "plan", "--profile", *same_stem]) == 2
    assert "2 profiles named 'p'" in capsys.readouterr().err
    one = ["backends", "plan", "--profile", str(tmp_path / "p.yaml")]
    for flag, value in [("--gpu-memory-gb", v) for v in ("0", "-1", "nan", "inf", "abc")] + [
        ("--concurrency", v) for v in ("0", "-1", "x")
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main([*one, flag, value])
        assert exit_info.value.code == 2, (flag, value)
        assert flag in capsys.readouterr().err
    files = {
        "nested.yaml": "[" * 5000 + "]" * 5000,
        "binary.yaml": b"\xd0\xcf\x11\xe0\xff",
        "empty.yaml": "",
        "huge.yaml": json.dumps(data | {"extra_args": ["--kv-cache-memory-bytes", "1e400g"]}),
        "inf.yaml": json.dumps(data | {"extra_args": ["--kv-cache-memory-bytes", "infk"]}),
        "neg.yaml": json.dumps(data | {"extra_args": ["--kv-cache-memory-bytes", "-5G"]}),
    }
    expected = {
        "nested.yaml": "nested too deeply",
        "binary.yaml": "binary.yaml: 'utf-8' codec can't decode",
        "empty.yaml": "<root>: Input should be",
        "huge.yaml": "not a finite number",
        "inf.yaml": "not a finite number",
        "neg.yaml": "cannot be negative",
    }
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        assert main(["backends", "plan", "--profile", str(path)]) == 1, name
        captured = capsys.readouterr()
        assert expected[name] in captured.out + captured.err, name
    assert main(["config", "check", str(tmp_path / "nested.yaml")]) == 1
    assert "nested too deeply" in capsys.readouterr().err
