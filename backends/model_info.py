"""What a model's architecture says about its memory, read locally and never downloaded.

:func:`load_model_info` looks for the model's ``config.json`` in a local folder or in the
Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``; ``models--ORG--NAME/snapshots/REV/config.json``), and otherwise
falls back to :data:`KNOWN_MODELS`, a table of real architecture numbers copied from the
models' published ``config.json`` files. Nothing here touches the network.

Parameter count: exact from ``*.safetensors`` headers when the folder holds them, else the
decoder formula of :func:`count_parameters`. KV cache per token: ``2 (K and V) x layers x
kv_heads x head_dim x bytes`` (vLLM docs, "Conserving Memory"; MLA models cache
``kv_lora_rank + qk_rope_head_dim`` per layer instead).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

# Real numbers from each model's published config.json (hidden_size, num_hidden_layers, ...).
_LLAMA31_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                   vocab_size=128256, tie_word_embeddings=False, model_type="llama",
                   max_position_embeddings=131072, torch_dtype="bfloat16")  # fmt: skip
_LLAMA31_70B = _LLAMA31_8B | dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                                  intermediate_size=28672)  # fmt: skip
_LLAMA32_1B = _LLAMA31_8B | dict(hidden_size=2048, num_hidden_layers=16, head_dim=64,
                                 intermediate_size=8192, tie_word_embeddings=True)  # fmt: skip
_LLAMA32_3B = _LLAMA31_8B | dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
                                 intermediate_size=8192, tie_word_embeddings=True)  # fmt: skip
_QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                   num_key_value_heads=2, head_dim=64, intermediate_size=4864, vocab_size=151936,
                   tie_word_embeddings=True, model_type="qwen2", max_position_embeddings=32768,
                   torch_dtype="bfloat16")  # fmt: skip
_QWEN25_7B = _QWEN25_05B | dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                                num_key_value_heads=4, head_dim=128, intermediate_size=18944,
                                vocab_size=152064, tie_word_embeddings=False)  # fmt: skip
_MISTRAL_7B = _LLAMA31_8B | dict(vocab_size=32768, model_type="mistral",
                                 max_position_embeddings=32768)  # fmt: skip

#: Known architectures by lower-case Hugging Face id (base and instruct share numbers).
KNOWN_MODELS: MappingProxyType[str, dict[str, Any]] = MappingProxyType(
    {
        **dict.fromkeys(
            [
                "meta-llama/llama-3.1-8b",
                "meta-llama/llama-3.1-8b-instruct",
                "meta-llama/meta-llama-3.1-8b-instruct",
                "meta-llama/meta-llama-3-8b-instruct",
            ],
            _LLAMA31_8B,
        ),  # fmt: skip
        **dict.fromkeys(
            [
                "meta-llama/llama-3.1-70b",
                "meta-llama/llama-3.1-70b-instruct",
                "meta-llama/meta-llama-3.1-70b-instruct",
                "meta-llama/llama-3.3-70b-instruct",
            ],
            _LLAMA31_70B,
        ),  # fmt: skip
        **dict.fromkeys(
            ["meta-llama/llama-3.2-1b", "meta-llama/llama-3.2-1b-instruct"], _LLAMA32_1B
        ),
        **dict.fromkeys(
            ["meta-llama/llama-3.2-3b", "meta-llama/llama-3.2-3b-instruct"], _LLAMA32_3B
        ),
        **dict.fromkeys(["qwen/qwen2.5-0.5b", "qwen/qwen2.5-0.5b-instruct"], _QWEN25_05B),
        **dict.fromkeys(["qwen/qwen2.5-7b", "qwen/qwen2.5-7b-instruct"], _QWEN25_7B),
        **dict.fromkeys(
            ["mistralai/mistral-7b-v0.3", "mistralai/mistral-7b-instruct-v0.3"], _MISTRAL_7B
        ),
    }
)

#: Bytes per weight of a serving dtype (``auto`` keeps the checkpoint's 16-bit type).
DTYPE_BYTES = MappingProxyType(
    {"float32": 4.0, "float": 4.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0}
)
#: Bytes per weight of a quantization method (packed weights; scales are not counted).
QUANT_BYTES = MappingProxyType(
    {"fp8": 1.0, "fbgemm_fp8": 1.0, "int8": 1.0, "experts_int8": 1.0, "awq": 0.5,
     "awq_marlin": 0.5, "gptq": 0.5, "gptq_marlin": 0.5, "bitsandbytes": 0.5, "mxfp4": 0.5,
     "modelopt_fp4": 0.5, "gguf": 0.5}
)  # fmt: skip


@dataclass(frozen=True)
class ModelInfo:
    """A model's architecture numbers and where they came from.

    ``source`` is e.g. ``"config.json at /m/target"`` or ``"built-in table"``;
    ``folder`` is the local folder when one was found (for tokenizer files).
    ``num_parameters`` is None when neither weights nor the config's fields give it.
    """

    ref: str
    config: dict[str, Any]
    num_parameters: int | None
    source: str
    folder: Path | None = None

    def get(self, key: str, default: Any = None) -> Any:
        """A ``config.json`` value, also read from ``text_config`` (multimodal models) and
        ``transformer_layer_config`` (heads in the speculators format, e.g. EAGLE-3 heads
        trained with the PyPI package ``speculators``)."""
        for section in (
            self.config,
            self.config.get("text_config"),
            self.config.get("transformer_layer_config"),
        ):
            if isinstance(section, dict) and key in section:
                return section[key]
        return default

    def get_int(self, key: str) -> int | None:
        """A whole-number ``config.json`` value (see :meth:`get`); None when absent or not
        an integer (booleans are not counted)."""
        value = self.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def get_str(self, key: str) -> str | None:
        """A text ``config.json`` value (see :meth:`get`); None when absent or not text."""
        value = self.get(key)
        return value if isinstance(value, str) else None

    @property
    def vocab_size(self) -> int | None:
        return self.get_int("vocab_size")

    @property
    def hidden_size(self) -> int | None:
        return self.get_int("hidden_size")

    @property
    def model_type(self) -> str | None:
        return self.get_str("model_type")

    @property
    def checkpoint_dtype(self) -> str | None:
        return self.get_str("torch_dtype") or self.get_str("dtype")

    def kv_bytes_per_token(self, element_bytes: float, tensor_parallel: int = 1) -> float:
        """KV cache bytes per token on one GPU: ``2 x layers x kv_heads x head_dim x bytes``.

        With tensor parallelism the KV heads are split (at least one per GPU). MLA models
        (``kv_lora_rank``) store one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer.
        Only full-attention layers count when ``layer_types`` names them.
        """
        layers = self.get_int("num_hidden_layers") or 0
        if isinstance(types := self.get("layer_types"), list) and types:
            layers = sum(1 for t in types if t in ("full_attention", "attention"))
        if rank := self.get_int("kv_lora_rank"):
            return layers * (rank + (self.get_int("qk_rope_head_dim") or 0)) * element_bytes
        heads = self.get_int("num_attention_heads") or 1
        kv_heads = self.get_int("num_key_value_heads") or heads
        head_dim = self.get_int("head_dim") or (self.get_int("hidden_size") or 0) // heads
        per_gpu = max(1, math.ceil(kv_heads / tensor_parallel))
        return 2 * layers * per_gpu * head_dim * element_bytes


def count_parameters(c: dict[str, Any]) -> int:
    """Parameters of a Llama-style decoder from its config (dense or simple MoE).

    Per layer: q, k, v, o projections (+ q/k/v biases for Qwen2 or ``attention_bias``), a
    gated MLP of 3 matrices (per expert, plus router and shared experts for MoE) and two
    RMSNorms; plus embeddings, the LM head unless tied, and the final norm. Exact for Llama,
    Qwen2 and Mistral (Llama-3.1-8B: 8,030,261,248); an estimate for other designs.
    """
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    d = c.get("head_dim") or h // heads
    attn = 2 * h * heads * d + 2 * h * kv * d
    if c.get("attention_bias") or c.get("model_type") == "qwen2":
        attn += heads * d + 2 * kv * d
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    if experts:
        inter = c.get("moe_intermediate_size") or c["intermediate_size"]
        shared = (c.get("n_shared_experts") or 0) * inter + c.get(
            "shared_expert_intermediate_size", 0
        )
        mlp = experts * 3 * h * inter + h * experts + 3 * h * shared
    else:
        mlp = 3 * h * c["intermediate_size"]
    embed = c["vocab_size"] * h
    head = 0 if c.get("tie_word_embeddings", False) else embed
    return int(layers * (attn + mlp + 2 * h) + embed + head + h)


def hf_hub_cache(environ: dict[str, str] | None = None) -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it (no import needed)."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or str(Path("~/.cache/huggingface").expanduser())
    return Path(home).expanduser() / "hub"


def find_model_dir(ref: str, hub_cache: Path | None = None) -> Path | None:
    """The local folder holding ``ref``'s ``config.json``, or None; never downloads.

    ``ref`` is a folder path or an ``ORG/NAME`` id looked up in the hub cache (the snapshot
    ``refs/main`` points to, else the newest snapshot that has a ``config.json``).
    """
    path = Path(ref).expanduser()
    if (path / "config.json").is_file():
        return path
    if ref.count("/") != 1 or ref.startswith(("/", ".")):
        return None
    repo = (hub_cache or hf_hub_cache()) / f"models--{ref.replace('/', '--')}"
    snapshots = repo / "snapshots"
    main = repo / "refs" / "main"
    if main.is_file() and (snapshots / main.read_text().strip() / "config.json").is_file():
        return snapshots / main.read_text().strip()
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


def safetensors_parameters(folder: Path) -> int | None:
    """Sum of tensor elements over the folder's ``*.safetensors`` headers (None without any).

    Reads only each file's header: an 8-byte little-endian length, then JSON
    ``{name: {"dtype", "shape", "data_offsets"}}`` (safetensors format spec).
    """
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def load_model_info(ref: str, hub_cache: Path | None = None) -> ModelInfo | None:
    """Architecture of ``ref`` from a local ``config.json`` or :data:`KNOWN_MODELS`.

    Returns None when neither has it. A local ``config.json`` that cannot be parsed raises
    ValueError naming the file.
    """
    folder = find_model_dir(ref, hub_cache)
    if folder is not None:
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read {folder / 'config.json'}: {exc}") from None
        params = safetensors_parameters(folder)
        how = "safetensors headers" if params is not None else "formula"
        if params is None:
            try:
                params = count_parameters(config.get("text_config", config))
            except (KeyError, TypeError, ZeroDivisionError):
                how = "parameter count unknown"
        return ModelInfo(ref, config, params, f"config.json at {folder} ({how})", folder)
    known = KNOWN_MODELS.get(ref.lower())
    if known is None:
        return None
    return ModelInfo(ref, dict(known), count_parameters(known), "built-in table")


def tokenizer_fingerprint(folder: Path | None) -> str | None:
    """sha256 of the folder's vocabulary, or None when no tokenizer file is there.

    ``tokenizer.json``: its ``model.vocab`` (token -> id) plus added tokens, canonical JSON,
    so files that differ only in templates or post-processing compare equal;
    ``vocab.json``: the same mapping; ``tokenizer.model`` (SentencePiece): the file bytes.
    """
    if folder is None:
        return None
    if (folder / "tokenizer.json").is_file():
        data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        added = sorted((t["id"], t["content"]) for t in data.get("added_tokens", []))
        payload = json.dumps([data.get("model", {}).get("vocab"), added], sort_keys=True)
    elif (folder / "vocab.json").is_file():
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        payload = json.dumps(vocab, sort_keys=True)
    elif (folder / "tokenizer.model").is_file():
        return hashlib.sha256((folder / "tokenizer.model").read_bytes()).hexdigest()
    else:
        return None
    return hashlib.sha256(payload.encode()).hexdigest()


def quantization_of(info: ModelInfo | None) -> str | None:
    """The checkpoint's quantization method (``quantization_config.quant_method``), if any."""
    qc = info.get("quantization_config") if info else None
    return qc.get("quant_method") if isinstance(qc, dict) else None


def bytes_per_parameter(dtype: str | None, quantization: str | None) -> tuple[float, str]:
    """Bytes per weight and a label, e.g. ``(2.0, "bfloat16")`` or ``(1.0, "fp8")``.

    Quantization wins over dtype; an unknown method or dtype counts as 2 bytes and says so.
    ``auto``/None is 2 bytes: vLLM serves fp32 checkpoints in 16-bit unless told otherwise.
    """
    if quantization:
        q = quantization.lower()
        if q in QUANT_BYTES:
            return QUANT_BYTES[q], q
        return 2.0, f"{quantization} (unknown quantization: counted as 2 bytes)"
    if dtype in (None, "auto"):
        return 2.0, "auto (16-bit)"
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype], dtype
    return 2.0, f"{dtype} (unknown dtype: counted as 2 bytes)"
