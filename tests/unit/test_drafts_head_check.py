"""The head-folder checks of ``specgate drafts check``/``train``: every bad input is refused
before a server starts, with the file and the problem named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from backends.drafts.head_check import HeadError, check_head, safetensors_header

HIDDEN, VOCAB = 8, 32


def speculators_config(hidden: int = HIDDEN, vocab: int = VOCAB) -> dict[str, Any]:
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": 16,
        "transformer_layer_config": {"hidden_size": hidden, "vocab_size": vocab},
    }


def write_head(folder: Path, config: dict[str, Any] | str, *, embed: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(text)
    tensors = {"fc.weight": np.zeros((HIDDEN, 3 * HIDDEN), dtype=np.float32)}
    if embed:
        tensors["embed_tokens.weight"] = np.zeros((VOCAB, HIDDEN), dtype=np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def target(tmp_path: Path) -> Path:
    folder = tmp_path / "target"
    folder.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN, "vocab_size": VOCAB}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text('{"model": "target"}')
    return folder


def test_a_good_head_passes(tmp_path: Path, target: Path) -> None:
    info = check_head(write_head(tmp_path / "head", speculators_config()), target)
    assert (info.hidden_size, info.vocab_size, info.draft_vocab_size) == (HIDDEN, VOCAB, 16)
    assert info.tensors == ("fc.weight",) and not info.has_embedding


def test_vllm_eagle3_llama_format_passes(tmp_path: Path, target: Path) -> None:
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": HIDDEN,
        "vocab_size": VOCAB,
    }
    assert check_head(write_head(tmp_path / "head", config, embed=True), target).has_embedding


def test_the_committed_head_passes_against_its_target_sizes(tmp_path: Path) -> None:
    head = Path(__file__).resolve().parents[2] / "backends/drafts/heads/smollm2-135m-eagle3"
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 576, "vocab_size": 49152}))
    assert not check_head(head, target).has_embedding


def _garble_safetensors(head: Path) -> None:
    (head / "model.safetensors").write_bytes(b"\xff" * 8 + b"not a header")


def _truncate_safetensors(head: Path) -> None:
    (head / "model.safetensors").write_bytes(b"\x01\x02")


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda h: (h / "config.json").unlink(), "config.json: missing"),
        (lambda h: (h / "config.json").write_text("{"), "config.json: not valid JSON"),
        (lambda h: (h / "config.json").write_text("[1]"), "config.json: not a JSON object"),
        (lambda h: (h / "model.safetensors").unlink(), "model.safetensors: missing"),
        (_garble_safetensors, "model.safetensors: unreadable safetensors header"),
        (_truncate_safetensors, "model.safetensors: unreadable safetensors header"),
    ],
)
def test_missing_or_garbled_files_are_named(
    tmp_path: Path, target: Path, damage: Any, expected: str
) -> None:
    head = write_head(tmp_path / "head", speculators_config())
    damage(head)
    with pytest.raises(HeadError, match=expected):
        check_head(head, target)


def test_missing_folder(tmp_path: Path, target: Path) -> None:
    with pytest.raises(HeadError, match="no such head folder"):
        check_head(tmp_path / "nope", target)


@pytest.mark.parametrize(
    "config",
    [
        {"architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN, "vocab_size": VOCAB},
        {"speculators_model_type": "mlp", "transformer_layer_config": {}},
        {},
    ],
)
def test_wrong_architecture(tmp_path: Path, target: Path, config: dict[str, Any]) -> None:
    head = write_head(tmp_path / "head", config)
    with pytest.raises(HeadError, match="not an EAGLE-3 head"):
        check_head(head, target)


@pytest.mark.parametrize(
    ("hidden", "vocab", "field"), [(HIDDEN * 2, VOCAB, "hidden_size"), (HIDDEN, 99, "vocab_size")]
)
def test_head_for_another_target(
    tmp_path: Path, target: Path, hidden: int, vocab: int, field: str
) -> None:
    head = write_head(tmp_path / "head", speculators_config(hidden, vocab))
    with pytest.raises(HeadError, match=f"head for another target: {field}"):
        check_head(head, target)


def test_a_different_tokenizer_is_refused(tmp_path: Path, target: Path) -> None:
    head = write_head(tmp_path / "head", speculators_config())
    (head / "tokenizer.json").write_text('{"model": "another"}')
    with pytest.raises(HeadError, match="different tokenizer"):
        check_head(head, target)
    (head / "tokenizer.json").write_text('{"model": "target"}')
    check_head(head, target)


def test_safetensors_header_lists_tensors(tmp_path: Path) -> None:
    head = write_head(tmp_path / "head", speculators_config(), embed=True)
    header = safetensors_header(head / "model.safetensors")
    assert sorted(header) == ["embed_tokens.weight", "fc.weight"]
