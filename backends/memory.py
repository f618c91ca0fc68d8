"""GPU memory a backend needs: weights, draft weights and KV cache, per GPU, in GiB.

The estimate follows how vLLM sizes memory (vLLM docs, "Conserving Memory" and the
``gpu_memory_utilization`` engine argument): the server may use ``gpu_memory_utilization x
GPU memory`` on each GPU (default 0.9); weights are loaded first, and what remains becomes the
KV cache, which must hold at least one ``max_model_len`` sequence or vLLM refuses to start.

- weights: parameters x bytes per parameter (dtype or quantization), split over
  ``tensor_parallel_size`` GPUs; the draft's over ``draft_tensor_parallel_size`` (a full copy
  per GPU when it is 1). The draft takes the target's dtype, as vLLM does.
- KV cache per token: ``2 x layers x kv_heads x head_dim x bytes`` for the target and the
  draft (vLLM gives draft layers KV cache too), kv_heads split over the GPUs.
- tokens: ``max_model_len`` (else the model's ``max_position_embeddings``, vLLM's default) x
  ``expected_concurrency`` (else the plan's default). For Llama-3.1-8B in 16-bit,
  128 KiB/token x 8192 x 4 sequences = 4 GiB.

- ``--kv-cache-memory-bytes`` in ``extra_args`` (vLLM >= 0.11) fixes the KV cache at that
  size, whatever ``gpu_memory_utilization`` leaves: the estimate then counts that size.

Not in ``need``: activations, CUDA graphs and the CUDA context, taken from the same budget, so
an estimate just under the budget is tight. :attr:`MemoryEstimate.expected_gib` adds
:data:`ENGINE_OVERHEAD_GIB` for them: what ``nvidia-smi`` should show per server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from backends.checks import ModelLookup, Problem
from backends.model_info import ModelInfo, bytes_per_parameter, quantization_of
from contracts.launch_profile import BackendProfile

GIB = 1024**3
#: vLLM's default ``--gpu-memory-utilization``.
DEFAULT_UTILIZATION = 0.9
#: Element bytes of ``--kv-cache-dtype`` values that shrink the cache (fp8 variants).
KV_DTYPE_BYTES = {"fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0}
#: CUDA context, activations and CUDA graphs of one server, per GPU, in GiB. Measured
#: (nvidia-smi minus weights and the fixed KV cache) on one H200, vLLM 0.26.0, SmolLM2-135M
#: bf16 with CUDA graphs: plain 2.2, ngram 2.6, draft model 2.9, EAGLE-3 3.3
#: (docs/benchmarks.md, section 5); ``--enforce-eager`` captures no graphs (not measured
#: here: 1 GiB assumed). Larger models need more activation memory: a floor, not a bound.
ENGINE_OVERHEAD_GIB = 2.5
EAGER_OVERHEAD_GIB = 1.0


@dataclass(frozen=True)
class MemoryLine:
    """One term of the estimate: e.g. ``("target weights", 14.96, "8.03B params x 2 B")``."""

    label: str
    gib: float
    detail: str


@dataclass
class MemoryEstimate:
    """Per-GPU memory of one backend (GiB) and the budget it must fit in."""

    lines: list[MemoryLine]
    weights_gib: float
    kv_bytes_per_token: float
    context: int
    concurrency: int
    gpu_memory_gib: float
    utilization: float
    notes: list[str] = field(default_factory=list)
    overhead_gib: float = ENGINE_OVERHEAD_GIB
    kv_fixed: bool = False

    @property
    def need_gib(self) -> float:
        """Weights plus KV cache for ``context x concurrency`` tokens."""
        return sum(line.gib for line in self.lines)

    @property
    def expected_gib(self) -> float:
        """``need_gib`` plus the engine's own overhead (context, activations, CUDA graphs):
        what one server should take per GPU when its KV cache is fixed."""
        return self.need_gib + self.overhead_gib

    @property
    def budget_gib(self) -> float:
        """What vLLM may use on each GPU: memory x gpu_memory_utilization."""
        return self.gpu_memory_gib * self.utilization

    @property
    def kv_tokens_that_fit(self) -> int:
        """Tokens of KV cache the budget leaves after the weights (0 when none)."""
        room = (self.budget_gib - self.weights_gib) * GIB
        return max(0, int(room // self.kv_bytes_per_token)) if self.kv_bytes_per_token else 0


def _arg_value(profile: BackendProfile, flag: str) -> str | None:
    """The value of ``flag`` in ``extra_args`` (``--flag V`` or ``--flag=V``), else None."""
    args = profile.extra_args
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.partition("=")[2]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def parse_human_int(text: str) -> int:
    """vLLM's human-readable integers (``human_readable_int`` in its argument parser):
    ``k``/``m``/``g``/``t`` are powers of 1000, ``K``/``M``/``G``/``T`` powers of 1024
    (``6G`` = 6 GiB). Raises ValueError."""
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    units |= {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    text = text.strip()
    if text.startswith("-"):
        raise ValueError(f"{text!r}: a size cannot be negative")
    if text and text[-1] in units:
        number = text[:-1]
        if text[-1].isupper() and not number.isdigit():
            raise ValueError(f"{text!r}: binary suffixes take whole numbers (vLLM refuses it)")
        value = float(number)
        if not math.isfinite(value):
            raise ValueError(f"{text!r}: not a finite number")
        return int(value * units[text[-1]])
    return int(text)


def _kv_element_bytes(profile: BackendProfile, dtype_bytes: float) -> float:
    args = profile.extra_args
    for i, arg in enumerate(args):
        value = arg.partition("=")[2] if arg.startswith("--kv-cache-dtype=") else None
        if arg == "--kv-cache-dtype" and i + 1 < len(args):
            value = args[i + 1]
        if value in KV_DTYPE_BYTES:
            return KV_DTYPE_BYTES[value]
    return dtype_bytes


def _weights(
    label: str, info: ModelInfo, dtype: str | None, quant: str | None, split: int
) -> MemoryLine:
    params = info.num_parameters or 0
    per_param, how = bytes_per_parameter(dtype, quant or quantization_of(info))
    gib = params * per_param / split / GIB
    shard = f" / {split} GPUs" if split > 1 else ""
    detail = f"{params / 1e9:.2f}B params x {per_param:g} B ({how}){shard}"
    return MemoryLine(label, gib, f"{detail} [{info.source}]")


def estimate_memory(
    name: str,
    profile: BackendProfile,
    lookup: ModelLookup,
    *,
    gpu_memory_gb: float = 80.0,
    concurrency: int = 4,
) -> tuple[MemoryEstimate | None, list[Problem]]:
    """The per-GPU estimate of ``profile`` and its memory problems.

    ``gpu_memory_gb`` (GiB per GPU) and ``concurrency`` apply when the profile does not set
    ``gpu_memory_gb`` / ``expected_concurrency``. Returns ``(None, [warning])`` when the
    target's architecture is unknown. Problems: an error when the weights plus one
    ``max_model_len`` sequence exceed the budget (vLLM will not start), a warning when the KV
    cache holds fewer than the expected sequences.
    """
    target = lookup(profile.model)
    if target is None or target.num_parameters is None:
        why = "no local config.json and no table entry" if target is None else target.source
        msg = f"memory not estimated: {why} for {profile.model}"
        return None, [Problem(name, "model", msg, "warning")]
    tp = profile.tensor_parallel_size or 1
    dtype = profile.dtype if profile.dtype not in (None, "auto") else target.checkpoint_dtype
    if dtype == "float32" and profile.dtype in (None, "auto"):
        dtype = None  # vLLM serves fp32 checkpoints in 16-bit under dtype auto
    lines = [_weights("target weights", target, dtype, profile.quantization, tp)]
    notes: list[str] = []
    per_token = target.kv_bytes_per_token(_kv_element_bytes(profile, _dtype_bytes(dtype)), tp)
    mtp_layers = target.get("num_nextn_predict_layers") or 0
    if profile.speculation.method == "mtp" and mtp_layers:
        per_token *= 1 + mtp_layers / target.get("num_hidden_layers", 1)
    kv_lines = [("KV cache target", per_token)]
    spec = profile.speculation
    if spec.model:
        draft = lookup(spec.model)
        if draft is None or draft.num_parameters is None:
            notes.append(f"draft {spec.model}: architecture unknown, not counted")
        else:
            split = spec.draft_tensor_parallel_size or tp
            lines.append(_weights("draft weights", draft, dtype, spec.quantization, split))
            elem = _kv_element_bytes(profile, _dtype_bytes(dtype))
            kv_lines.append(("KV cache draft", draft.kv_bytes_per_token(elem, split)))
    context = profile.max_model_len or target.get("max_position_embeddings") or 4096
    seqs = profile.expected_concurrency or concurrency
    weights = sum(line.gib for line in lines)
    fixed = _arg_value(profile, "--kv-cache-memory-bytes")
    kv_fixed = False
    bad_kv: list[Problem] = []
    if fixed is not None:
        try:
            size = parse_human_int(fixed)
            if size <= 0:
                raise ValueError("must be positive")
        except ValueError as exc:
            msg = f"--kv-cache-memory-bytes {fixed!r}: {exc} (e.g. 6G = 6 GiB, 6g = 6e9 bytes)"
            bad_kv.append(Problem(name, "extra_args", msg))
            notes.append("--kv-cache-memory-bytes not understood: KV cache estimated without it")
        else:
            kv_fixed = True
            per_token_all = sum(b for _, b in kv_lines)
            tokens = int(size // per_token_all) if per_token_all else 0
            detail = f"--kv-cache-memory-bytes {fixed}: {tokens:,} tokens"
            detail += f" = {tokens / context:.1f} sequences of {context:,}"
            lines.append(MemoryLine("KV cache (fixed)", size / GIB, detail))
            seqs = max(1, tokens // context) if tokens >= context else seqs
    for label, bytes_per_token in [] if kv_fixed else kv_lines:
        detail = f"{bytes_per_token / 1024:.1f} KiB/token x {context * seqs:,} tokens"
        detail += f" ({context:,} context x {seqs} sequences)"
        lines.append(MemoryLine(label, bytes_per_token * context * seqs / GIB, detail))
    estimate = MemoryEstimate(
        lines=lines,
        weights_gib=weights,
        kv_bytes_per_token=sum(b for _, b in kv_lines),
        context=context,
        concurrency=seqs,
        gpu_memory_gib=profile.gpu_memory_gb or gpu_memory_gb,
        utilization=profile.gpu_memory_utilization or DEFAULT_UTILIZATION,
        notes=notes,
        overhead_gib=EAGER_OVERHEAD_GIB
        if "--enforce-eager" in profile.extra_args
        else ENGINE_OVERHEAD_GIB,
        kv_fixed=kv_fixed,
    )
    return estimate, bad_kv + _memory_problems(name, estimate)


def _dtype_bytes(dtype: str | None) -> float:
    return bytes_per_parameter(dtype, None)[0]


def _memory_problems(name: str, e: MemoryEstimate) -> list[Problem]:
    if e.kv_fixed:  # vLLM sizes nothing from gpu_memory_utilization then
        kv_bytes = (e.need_gib - e.weights_gib) * GIB
        tokens = int(kv_bytes // e.kv_bytes_per_token) if e.kv_bytes_per_token else 0
        if tokens < e.context:
            msg = (
                f"the fixed KV cache holds {tokens:,} tokens, under one {e.context:,}-token "
                "sequence: vLLM will not start (a larger --kv-cache-memory-bytes or a smaller "
                "max_model_len)"
            )
            return [Problem(name, "extra_args", msg)]
        if e.expected_gib > e.gpu_memory_gib:
            msg = (
                f"expects {e.expected_gib:.2f} GiB per GPU with its fixed KV cache, over the "
                f"GPU's {e.gpu_memory_gib:g} GiB"
            )
            return [Problem(name, "extra_args", msg)]
        return []
    budget = f"{e.budget_gib:.2f} GiB ({e.gpu_memory_gib:g} GiB x {e.utilization:g})"
    one_sequence = e.weights_gib + e.kv_bytes_per_token * e.context / GIB
    if one_sequence > e.budget_gib:
        msg = (
            f"weights {e.weights_gib:.2f} GiB + KV cache for one {e.context:,}-token sequence "
            f"need {one_sequence:.2f} GiB per GPU, over the budget of {budget}: vLLM will "
            "not start (lower max_model_len, quantize, or add GPUs)"
        )
        return [Problem(name, "max_model_len", msg)]
    if e.need_gib > e.budget_gib:
        fit = e.kv_tokens_that_fit
        msg = (
            f"needs {e.need_gib:.2f} GiB per GPU, over the budget of {budget}: the KV cache "
            f"holds about {fit:,} tokens, {fit / e.context:.1f} sequences of {e.context:,} "
            f"instead of {e.concurrency}"
        )
        return [Problem(name, "expected_concurrency", msg, "warning")]
    return []
