"""A cost twin of the local target: SmolLM2-135M widened, without changing its function, into
a 5.7B Llama whose decode steps cost what a ~6B target's do on a GPU.

    python -m bench.twin_build --source DIR --head DIR --out DIR   # on a GPU host (torch)

Why: on an H200 the 135M target is overhead-bound (a step is ~2 ms of fixed cost), so
speculation never pays there and GPU figures test the gateway, not routing. No larger model
reaches the GPU host (no network, 64 MiB per transfer); the twin is built there from the
target the local stack already converts from its GGUF (``specgate models prepare``,
``backends/convert.py``). It is a *cost stand-in for a larger target, not a better model*:
same tokens, the memory traffic of a 5.7B model per step. Construction
(``../shared/notes/gpu-costtwin.md``, :class:`TwinShape` defaults):

- hidden 576 -> 4096: the real dimensions first, the rest zero (embedding, tied head, every
  projection), so the residual stream's extra dimensions stay exactly zero;
- attention heads 9 -> 64 with head_dim kept at 64 (rotary unchanged), KV heads 3 -> 8: the
  q heads of KV group g go to q positions ``g * 8 + i`` (:func:`head_slots`), so each still
  reads its own KV head; every other q/k/v head is zero and ``o_proj`` reads only real heads;
- intermediate 1536 -> 11008 (extra gate/up rows and down columns zero);
- RMSNorm: weights x sqrt(576/4096) on the real dimensions, 0 elsewhere, and ``rms_norm_eps``
  x 576/4096: for x zero beyond 576, rms_4096(x) with the scaled eps is
  sqrt(576/4096) * rms_576(x), so x / rms' * w' equals x / rms * w exactly;
- 2 identity layers appended (all projections zero: their attention and MLP add 0) -> 32 layers.

The committed EAGLE-3 head (``backends/drafts/heads/smollm2-135m-eagle3``, speculators format)
is widened the same way (:func:`widen_eagle3`): vLLM shares the target's embedding with a head
that has none, so the head's own hidden size must be the twin's. Its ``fc`` input (three
target hidden states, 3 x 576) becomes 3 x 4096 with each block's real columns first, its
``input_norm`` over that concatenation keeps the ratio 1728/12288 = 576/4096, its attention
input (embedding and hidden state, 2 x 576) becomes 2 x 4096, and its layer is widened as a
target layer. The draft vocabulary (``d2t``, ``t2d``, ``lm_head`` rows) is unchanged.

The widening works on ``{name: numpy array}`` states and config dicts (numpy only, so a unit
test checks its math without torch); :func:`llama_logits` and :func:`eagle3_logits` are numpy
reference forwards used to check it (vLLM's ``llama_eagle3.py`` for the head: layer 0 cats the
normed embedding with the normed fc output, ``norm_before_residual``). ``build`` (torch,
transformers, a CUDA GPU) writes the bf16 twin and head and checks both in fp32: greedy tokens
of the twin vs the 135M (transformers, on the GPU), max |logit difference|, and the head's
draft logits before and after widening on real hidden states (numpy).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

State = dict[str, np.ndarray]


@dataclass(frozen=True)
class TwinShape:
    """The twin's sizes; defaults: a 5.7B Llama (5,738,074,112 parameters, 11.48 GB bf16)."""

    hidden: int = 4096
    heads: int = 64
    kv_heads: int = 8
    intermediate: int = 11008
    layers: int = 32


def head_slots(src_heads: int, src_kv: int, dst_heads: int, dst_kv: int) -> list[int]:
    """Destination q-head index of each source q head, so GQA grouping holds.

    Source head ``h`` reads KV head ``g = h // (src_heads / src_kv)``; it goes to
    ``g * (dst_heads / dst_kv) + i`` (``i`` its place in its group), which reads destination
    KV head ``g`` (source KV head g goes to g). Raises ValueError when the counts do not divide
    or the destination has fewer KV heads or fewer q heads per group.
    """
    if src_heads % src_kv or dst_heads % dst_kv:
        raise ValueError(f"heads {src_heads}/{dst_heads} not divisible by KV heads")
    src_group, dst_group = src_heads // src_kv, dst_heads // dst_kv
    if dst_kv < src_kv or dst_group < src_group:
        raise ValueError(
            f"cannot place {src_heads} heads / {src_kv} KV heads into {dst_heads} / {dst_kv}"
        )
    return [(h // src_group) * dst_group + h % src_group for h in range(src_heads)]


def _placed(
    a: np.ndarray, shape: tuple[int, ...], rows: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    out = np.zeros(shape, dtype=a.dtype)
    out[np.ix_(rows, cols)] = a
    return out


def _head_index(slots: Sequence[int], head_dim: int) -> np.ndarray:
    """Row (or column) indices of the given heads' dimensions."""
    return np.concatenate([np.arange(s * head_dim, (s + 1) * head_dim) for s in slots])


def _blocks(n: int, src: int, dst: int) -> np.ndarray:
    """Indices of the real ``src`` dimensions of each of ``n`` concatenated blocks of ``dst``."""
    return np.concatenate([np.arange(b * dst, b * dst + src) for b in range(n)])


def _norm(w: np.ndarray, dst: int, ratio: float) -> np.ndarray:
    out = np.zeros((dst,), dtype=w.dtype)
    out[: w.shape[0]] = w * np.asarray(math.sqrt(ratio), dtype=w.dtype)
    return out


def _layer(
    state: Mapping[str, np.ndarray],
    prefix: str,
    src: Mapping[str, int],
    shape: TwinShape,
    in_blocks: int = 1,
) -> State:
    """One widened decoder layer (keys under ``prefix``); ``in_blocks`` concatenated inputs
    of the hidden size feed q/k/v (2 for an EAGLE-3 head's first layer)."""
    h, d = src["hidden"], src["head_dim"]
    ratio = h / shape.hidden
    q_slots = head_slots(src["heads"], src["kv_heads"], shape.heads, shape.kv_heads)
    q_rows, kv_rows = _head_index(q_slots, d), _head_index(range(src["kv_heads"]), d)
    cols_in = _blocks(in_blocks, h, shape.hidden)
    real = np.arange(h)
    inter = np.arange(src["intermediate"])
    wide_in = in_blocks * shape.hidden
    get = lambda name: state[prefix + name]  # noqa: E731
    out: State = {
        "self_attn.q_proj.weight": _placed(
            get("self_attn.q_proj.weight"), (shape.heads * d, wide_in), q_rows, cols_in
        ),
        "self_attn.k_proj.weight": _placed(
            get("self_attn.k_proj.weight"), (shape.kv_heads * d, wide_in), kv_rows, cols_in
        ),
        "self_attn.v_proj.weight": _placed(
            get("self_attn.v_proj.weight"), (shape.kv_heads * d, wide_in), kv_rows, cols_in
        ),
        "self_attn.o_proj.weight": _placed(
            get("self_attn.o_proj.weight"), (shape.hidden, shape.heads * d), real, q_rows
        ),
        "mlp.gate_proj.weight": _placed(
            get("mlp.gate_proj.weight"), (shape.intermediate, shape.hidden), inter, real
        ),
        "mlp.up_proj.weight": _placed(
            get("mlp.up_proj.weight"), (shape.intermediate, shape.hidden), inter, real
        ),
        "mlp.down_proj.weight": _placed(
            get("mlp.down_proj.weight"), (shape.hidden, shape.intermediate), real, inter
        ),
    }
    for key in state:
        if key.startswith(prefix) and key.endswith("norm.weight"):
            out[key.removeprefix(prefix)] = _norm(state[key], shape.hidden, ratio)
    return {prefix + k: v for k, v in out.items()}


def _source_dims(config: Mapping[str, Any]) -> dict[str, int]:
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    return {
        "hidden": hidden,
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": int(config.get("head_dim") or hidden // heads),
        "intermediate": int(config["intermediate_size"]),
        "layers": int(config["num_hidden_layers"]),
    }


def _check_fits(src: Mapping[str, int], shape: TwinShape) -> None:
    if shape.hidden < src["hidden"] or shape.intermediate < src["intermediate"]:
        raise ValueError(f"{shape} is narrower than the source {dict(src)}")
    if shape.heads * src["head_dim"] < src["heads"] * src["head_dim"]:
        raise ValueError(f"{shape.heads} heads hold fewer dimensions than the source's")


def _widened_config(config: Mapping[str, Any], shape: TwinShape, layers: int) -> dict[str, Any]:
    src = _source_dims(config)
    out = copy.deepcopy(dict(config))
    out.update(
        hidden_size=shape.hidden,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=src["head_dim"],
        intermediate_size=shape.intermediate,
        num_hidden_layers=layers,
        rms_norm_eps=float(config["rms_norm_eps"]) * src["hidden"] / shape.hidden,
    )
    if isinstance(out.get("layer_types"), list) and out["layer_types"]:
        types = out["layer_types"]
        out["layer_types"] = (types + [types[-1]] * layers)[:layers]
    return out


def widen_llama(
    state: Mapping[str, np.ndarray], config: Mapping[str, Any], shape: TwinShape = TwinShape()
) -> tuple[State, dict[str, Any]]:
    """The twin of a Llama causal LM: ``(state, config)`` in the Hugging Face layout
    (``model.layers.N.…``, ``model.embed_tokens.weight``, ``model.norm.weight``, an
    ``lm_head.weight`` only where the source has one).

    Extra layers beyond the source's (``shape.layers``) are identity layers: zero projections,
    norms copied from the last real layer. Arrays keep the source's dtype. Raises ValueError
    when ``shape`` is narrower than the source or the heads cannot be placed, KeyError for a
    missing tensor.
    """
    src = _source_dims(config)
    _check_fits(src, shape)
    if shape.layers < src["layers"]:
        raise ValueError(f"{shape.layers} layers: fewer than the source's {src['layers']}")
    vocab_rows = np.arange(state["model.embed_tokens.weight"].shape[0])
    real = np.arange(src["hidden"])
    out: State = {}
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        if key in state:
            out[key] = _placed(state[key], (len(vocab_rows), shape.hidden), vocab_rows, real)
    out["model.norm.weight"] = _norm(
        state["model.norm.weight"], shape.hidden, src["hidden"] / shape.hidden
    )
    for n in range(src["layers"]):
        out.update(_layer(state, f"model.layers.{n}.", src, shape))
    last = f"model.layers.{src['layers'] - 1}."
    for n in range(src["layers"], shape.layers):
        for key, value in _layer(state, last, src, shape).items():
            name = f"model.layers.{n}." + key.removeprefix(last)
            out[name] = value if name.endswith("norm.weight") else np.zeros_like(value)
    return out, _widened_config(config, shape, shape.layers)


def widen_eagle3(
    state: Mapping[str, np.ndarray], config: Mapping[str, Any], shape: TwinShape = TwinShape()
) -> tuple[State, dict[str, Any]]:
    """An EAGLE-3 head (speculators format: ``fc``, ``input_norm``, ``layers.0.…``, ``norm``,
    ``lm_head``, ``d2t``, ``t2d``; config with ``transformer_layer_config``) widened to serve
    the twin of its target: its hidden size becomes ``shape.hidden``. Raises ValueError or
    KeyError as :func:`widen_llama`.
    """
    layer_cfg = config["transformer_layer_config"]
    src = _source_dims(layer_cfg)
    _check_fits(src, shape)
    h, ratio = src["hidden"], src["hidden"] / shape.hidden
    aux = state["fc.weight"].shape[1] // h
    out: State = {}
    for n in range(src["layers"]):
        out.update(_layer(state, f"layers.{n}.", src, shape, in_blocks=2 if n == 0 else 1))
    real = np.arange(h)
    out["fc.weight"] = _placed(
        state["fc.weight"], (shape.hidden, aux * shape.hidden), real, _blocks(aux, h, shape.hidden)
    )
    if "input_norm.weight" in state:  # an RMSNorm over the aux concatenation: same ratio
        wide = np.zeros((aux * shape.hidden,), dtype=state["input_norm.weight"].dtype)
        wide[_blocks(aux, h, shape.hidden)] = state["input_norm.weight"] * np.asarray(
            math.sqrt(ratio), dtype=wide.dtype
        )
        out["input_norm.weight"] = wide
    out["norm.weight"] = _norm(state["norm.weight"], shape.hidden, ratio)
    lm = state["lm_head.weight"]
    out["lm_head.weight"] = _placed(lm, (lm.shape[0], shape.hidden), np.arange(lm.shape[0]), real)
    for key in ("d2t", "t2d"):
        if key in state:
            out[key] = state[key]
    if "embed_tokens.weight" in state:  # a head that kept its copy of the target's embedding
        emb = state["embed_tokens.weight"]
        out["embed_tokens.weight"] = _placed(
            emb, (emb.shape[0], shape.hidden), np.arange(emb.shape[0]), real
        )
    wide_cfg = copy.deepcopy(dict(config))
    wide_cfg["transformer_layer_config"] = _widened_config(layer_cfg, shape, src["layers"])
    return out, wide_cfg


# --- numpy reference forwards (check the widening; not fast) ---


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Llama's RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Rotary embedding (Hugging Face's rotate-half layout), x: (heads, T, head_dim)."""
    t, d = x.shape[1], x.shape[2]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(np.arange(t), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rot = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return (x * cos + rot * sin).astype(x.dtype)


def _theta(config: Mapping[str, Any]) -> float:
    params = config.get("rope_parameters") or {}
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)))


def _attention(
    x: np.ndarray, state: Mapping[str, np.ndarray], p: str, cfg: Mapping[str, Any]
) -> np.ndarray:
    dims = _source_dims(cfg)
    d, heads, kv = dims["head_dim"], dims["heads"], dims["kv_heads"]
    t = x.shape[0]

    def split(w: np.ndarray, n: int) -> np.ndarray:
        return (x @ w.T).reshape(t, n, d).transpose(1, 0, 2)

    q = _rope(split(state[p + "self_attn.q_proj.weight"], heads), _theta(cfg))
    k = _rope(split(state[p + "self_attn.k_proj.weight"], kv), _theta(cfg))
    v = split(state[p + "self_attn.v_proj.weight"], kv)
    k, v = np.repeat(k, heads // kv, axis=0), np.repeat(v, heads // kv, axis=0)
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    attn = (scores / scores.sum(-1, keepdims=True)) @ v
    return attn.transpose(1, 0, 2).reshape(t, heads * d) @ state[p + "self_attn.o_proj.weight"].T


def _mlp(x: np.ndarray, state: Mapping[str, np.ndarray], p: str) -> np.ndarray:
    gate = x @ state[p + "mlp.gate_proj.weight"].T
    up = x @ state[p + "mlp.up_proj.weight"].T
    return (gate / (1.0 + np.exp(-gate)) * up) @ state[p + "mlp.down_proj.weight"].T


def llama_logits(
    state: Mapping[str, np.ndarray], config: Mapping[str, Any], ids: Sequence[int]
) -> np.ndarray:
    """Logits (T, vocab) of a Llama causal LM for token ids ``ids`` (one sequence)."""
    eps = float(config["rms_norm_eps"])
    x = state["model.embed_tokens.weight"][np.asarray(ids)]
    for n in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{n}."
        x = x + _attention(rms_norm(x, state[p + "input_layernorm.weight"], eps), state, p, config)
        x = x + _mlp(rms_norm(x, state[p + "post_attention_layernorm.weight"], eps), state, p)
    head = state.get("lm_head.weight", state["model.embed_tokens.weight"])
    return rms_norm(x, state["model.norm.weight"], eps) @ head.T


def eagle3_logits(
    state: Mapping[str, np.ndarray], config: Mapping[str, Any], embeds: np.ndarray, aux: np.ndarray
) -> np.ndarray:
    """Draft logits (T, draft vocab) of a one-layer EAGLE-3 head, as vLLM's
    ``llama_eagle3.py`` computes them with ``norm_before_fc`` and ``norm_before_residual``:
    ``embeds`` (T, hidden) are the next tokens' embeddings, ``aux`` (T, k * hidden) the
    target's concatenated auxiliary hidden states."""
    cfg = config["transformer_layer_config"]
    eps = float(cfg["rms_norm_eps"])
    if "input_norm.weight" in state:
        aux = rms_norm(aux, state["input_norm.weight"], eps)
    hidden = aux @ state["fc.weight"].T
    p = "layers.0."
    hidden = rms_norm(hidden, state[p + "hidden_norm.weight"], eps)
    residual = hidden
    x = np.concatenate([rms_norm(embeds, state[p + "input_layernorm.weight"], eps), hidden], -1)
    x = _attention(x, state, p, cfg) + residual
    x = _mlp(rms_norm(x, state[p + "post_attention_layernorm.weight"], eps), state, p) + x
    return rms_norm(x, state["norm.weight"], eps) @ state["lm_head.weight"].T
