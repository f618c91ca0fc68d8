"""Checks of an EAGLE-3 head folder against its target, before any server starts.

Pure file reading (no torch, no safetensors package): a head folder must hold a JSON
``config.json`` of the speculators EAGLE-3 format (``speculators_model_type: eagle3``) or of
vLLM's own EAGLE-3 Llama format (``architectures: [LlamaForCausalLMEagle3]``), and a
``model.safetensors`` whose header (8-byte little-endian length, then JSON) reads. Its layer's
``hidden_size`` and ``vocab_size`` must be the target's, and a tokenizer shipped with the head
must be the target's. Every problem is a :class:`HeadError` naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``architectures`` values of EAGLE-3 heads that vLLM serves with ``method: eagle3``.
EAGLE3_ARCHITECTURES = frozenset(
    {"Eagle3DraftModel", "LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"}
)
#: Refuse headers larger than this (a real header is a few KB; garbage gives huge numbers).
MAX_HEADER_BYTES = 100 * 1024 * 1024


class HeadError(ValueError):
    """A head folder (or its target) is unusable; the message names the file and the problem."""


@dataclass(frozen=True)
class HeadInfo:
    """What the checks read: layer sizes, draft vocabulary, tensor names and file size."""

    path: Path
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int | None
    tensors: tuple[str, ...]
    size_bytes: int

    @property
    def has_embedding(self) -> bool:
        """True if the head carries its own copy of the target's embedding."""
        return any("embed_tokens" in name for name in self.tensors)


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; HeadError if missing, unreadable or not an object."""
    if not path.is_file():
        raise HeadError(f"{path}: missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise HeadError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise HeadError(f"{path}: not a JSON object")
    return data


def safetensors_header(path: Path) -> dict[str, Any]:
    """The header of a safetensors file: ``{tensor name: {dtype, shape, data_offsets}}``
    (``__metadata__`` dropped). HeadError if missing, truncated or not a safetensors file."""
    if not path.is_file():
        raise HeadError(f"{path}: missing")
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise HeadError(f"{path}: unreadable safetensors header (file too short)")
            (length,) = struct.unpack("<Q", prefix)
            size = path.stat().st_size
            if length == 0 or length > MAX_HEADER_BYTES or 8 + length > size:
                raise HeadError(f"{path}: unreadable safetensors header (length {length})")
            header = json.loads(handle.read(length).decode("utf-8"))
    except OSError as exc:
        raise HeadError(f"{path}: {exc}") from None
    except (UnicodeDecodeError, ValueError):
        raise HeadError(f"{path}: unreadable safetensors header (not JSON)") from None
    if not isinstance(header, dict):
        raise HeadError(f"{path}: unreadable safetensors header (not an object)")
    header.pop("__metadata__", None)
    return header


def _layer_config(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The decoder layer's config: speculators' ``transformer_layer_config`` or the top level."""
    archs = set(config.get("architectures") or [])
    if config.get("speculators_model_type") == "eagle3":
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise HeadError(f"{path}: speculators eagle3 config without transformer_layer_config")
        return layer
    if archs & EAGLE3_ARCHITECTURES:
        return config
    kind = config.get("speculators_model_type") or sorted(archs) or "no architecture"
    raise HeadError(
        f"{path}: not an EAGLE-3 head ({kind}); expected speculators_model_type 'eagle3' "
        f"or architectures {sorted(EAGLE3_ARCHITECTURES)}"
    )


def _int_field(data: dict[str, Any], key: str, path: Path) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise HeadError(f"{path}: {key} missing or not a positive integer ({value!r})")
    return value


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_head(head: Path, target: Path) -> HeadInfo:
    """Check the head folder ``head`` against the target model folder ``target``.

    Returns the :class:`HeadInfo`. Raises HeadError for: a missing folder; a missing or
    garbled ``config.json`` or ``model.safetensors``; a config that is not EAGLE-3; a head
    whose ``hidden_size`` or ``vocab_size`` differ from the target's ``config.json``; a
    ``tokenizer.json`` in the head that differs from the target's.
    """
    if not head.is_dir():
        raise HeadError(f"{head}: no such head folder")
    config_path = head / "config.json"
    config = read_json(config_path)
    layer = _layer_config(config, config_path)
    tensors = safetensors_header(head / "model.safetensors")
    if not tensors:
        raise HeadError(f"{head / 'model.safetensors'}: holds no tensors")
    target_config = read_json(target / "config.json")
    target_config = target_config.get("text_config", target_config)
    for key in ("hidden_size", "vocab_size"):
        mine = _int_field(layer, key, config_path)
        theirs = _int_field(target_config, key, target / "config.json")
        if mine != theirs:
            raise HeadError(
                f"{config_path}: head for another target: {key} {mine}, "
                f"target {target} has {theirs}"
            )
    head_tok, target_tok = head / "tokenizer.json", target / "tokenizer.json"
    if head_tok.is_file() and target_tok.is_file():
        if _file_digest(head_tok) != _file_digest(target_tok):
            raise HeadError(f"{head_tok}: a different tokenizer than the target's {target_tok}")
    draft_vocab = config.get("draft_vocab_size")
    return HeadInfo(
        path=head,
        hidden_size=layer["hidden_size"],
        vocab_size=layer["vocab_size"],
        draft_vocab_size=draft_vocab if isinstance(draft_vocab, int) else None,
        tensors=tuple(sorted(tensors)),
        size_bytes=(head / "model.safetensors").stat().st_size,
    )
