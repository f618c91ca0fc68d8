"""bench.twin: the function-preserving widening, on tiny random Llamas and EAGLE-3 heads
(numpy float64, no torch; the GPU host checks the real 5.7B twin in fp32)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.twin import (
    TwinShape,
    eagle3_logits,
    head_slots,
    llama_logits,
    widen_eagle3,
    widen_llama,
)

# 3 q heads on 1 KV head... no: 6 q heads on 2 KV heads (groups of 3), head_dim 4, like the
# 135M's 9 on 3; widened to 16 heads on 4 KV heads (groups of 4), as 64 on 8.
SMALL = {
    "hidden_size": 24,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 4,
    "intermediate_size": 40,
    "num_hidden_layers": 2,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "vocab_size": 50,
    "layer_types": ["full_attention", "full_attention"],
}
WIDE = TwinShape(hidden=64, heads=16, kv_heads=4, intermediate=96, layers=3)


def random_llama(rng: np.random.Generator) -> dict[str, np.ndarray]:
    h, d, ff, v = 24, 4, 40, 50
    state = {
        "model.embed_tokens.weight": rng.normal(size=(v, h)),
        "model.norm.weight": rng.uniform(0.5, 1.5, size=h),
    }
    for n in range(2):
        p = f"model.layers.{n}."
        state |= {
            p + "input_layernorm.weight": rng.uniform(0.5, 1.5, size=h),
            p + "post_attention_layernorm.weight": rng.uniform(0.5, 1.5, size=h),
            p + "self_attn.q_proj.weight": rng.normal(size=(6 * d, h)) / 3,
            p + "self_attn.k_proj.weight": rng.normal(size=(2 * d, h)) / 3,
            p + "self_attn.v_proj.weight": rng.normal(size=(2 * d, h)) / 3,
            p + "self_attn.o_proj.weight": rng.normal(size=(h, 6 * d)) / 3,
            p + "mlp.gate_proj.weight": rng.normal(size=(ff, h)) / 3,
            p + "mlp.up_proj.weight": rng.normal(size=(ff, h)) / 3,
            p + "mlp.down_proj.weight": rng.normal(size=(h, ff)) / 3,
        }
    return state


def random_head(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    h, d, ff, draft = 24, 4, 40, 16
    state = {
        "fc.weight": rng.normal(size=(h, 3 * h)) / 5,
        "input_norm.weight": rng.uniform(0.5, 1.5, size=3 * h),
        "norm.weight": rng.uniform(0.5, 1.5, size=h),
        "lm_head.weight": rng.normal(size=(draft, h)),
        "d2t": np.arange(draft, dtype=np.int64),
        "t2d": np.arange(50) < draft,
        "layers.0.hidden_norm.weight": rng.uniform(0.5, 1.5, size=h),
        "layers.0.input_layernorm.weight": rng.uniform(0.5, 1.5, size=h),
        "layers.0.post_attention_layernorm.weight": rng.uniform(0.5, 1.5, size=h),
        "layers.0.self_attn.q_proj.weight": rng.normal(size=(6 * d, 2 * h)) / 4,
        "layers.0.self_attn.k_proj.weight": rng.normal(size=(2 * d, 2 * h)) / 4,
        "layers.0.self_attn.v_proj.weight": rng.normal(size=(2 * d, 2 * h)) / 4,
        "layers.0.self_attn.o_proj.weight": rng.normal(size=(h, 6 * d)) / 4,
        "layers.0.mlp.gate_proj.weight": rng.normal(size=(ff, h)) / 4,
        "layers.0.mlp.up_proj.weight": rng.normal(size=(ff, h)) / 4,
        "layers.0.mlp.down_proj.weight": rng.normal(size=(h, ff)) / 4,
    }
    config = {
        "draft_vocab_size": draft,
        "norm_before_fc": True,
        "transformer_layer_config": {**SMALL, "num_hidden_layers": 1, "tie_word_embeddings": False},
    }
    return state, config


def test_head_slots_keep_gqa_groups() -> None:
    # the 135M: 9 heads on 3 KV heads -> 64 on 8: group g's heads at 8g, 8g+1, 8g+2
    slots = head_slots(9, 3, 64, 8)
    assert slots == [0, 1, 2, 8, 9, 10, 16, 17, 18]
    assert [s // 8 for s in slots] == [h // 3 for h in range(9)]  # same KV head each
    with pytest.raises(ValueError, match="cannot place"):
        head_slots(9, 3, 16, 8)  # groups of 2 cannot hold groups of 3
    with pytest.raises(ValueError, match="not divisible"):
        head_slots(9, 3, 64, 7)


def test_widened_llama_is_the_same_function() -> None:
    rng = np.random.default_rng(7)
    state = random_llama(rng)
    wide, cfg = widen_llama(state, SMALL, WIDE)
    assert cfg["hidden_size"] == 64 and cfg["num_hidden_layers"] == 3
    assert cfg["num_attention_heads"] == 16 and cfg["num_key_value_heads"] == 4
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5 * 24 / 64)
    assert cfg["layer_types"] == ["full_attention"] * 3
    assert wide["model.layers.0.self_attn.q_proj.weight"].shape == (64, 64)
    assert wide["model.layers.2.mlp.down_proj.weight"].shape == (64, 96)
    assert not wide["model.layers.2.self_attn.o_proj.weight"].any()  # the identity layer
    ids = [3, 17, 42, 8, 8, 1, 33, 49, 0, 21]
    small, big = llama_logits(state, SMALL, ids), llama_logits(wide, cfg, ids)
    assert big.shape == small.shape == (10, 50)
    np.testing.assert_allclose(big, small, rtol=0, atol=1e-9)
    # and the widening is not vacuous: a wrong eps or a misplaced head changes the function
    off = dict(cfg, rms_norm_eps=1e-5)
    assert np.abs(llama_logits(wide, off, ids) - small).max() > 1e-6
    moved = dict(wide)
    q = wide["model.layers.0.self_attn.q_proj.weight"].copy()
    q[[4, 5, 6, 7, 16, 17, 18, 19]] = q[[16, 17, 18, 19, 4, 5, 6, 7]]  # head 1 <-> head 4
    moved["model.layers.0.self_attn.q_proj.weight"] = q
    assert np.abs(llama_logits(moved, cfg, ids) - small).max() > 1e-3


def test_widened_eagle3_head_keeps_its_draft_logits() -> None:
    rng = np.random.default_rng(11)
    state, config = random_head(rng)
    wide, cfg = widen_eagle3(state, config, WIDE)
    layer = cfg["transformer_layer_config"]
    assert layer["hidden_size"] == 64 and layer["num_hidden_layers"] == 1
    assert wide["fc.weight"].shape == (64, 3 * 64)
    assert wide["layers.0.self_attn.q_proj.weight"].shape == (64, 2 * 64)
    assert wide["lm_head.weight"].shape == (16, 64)
    assert (wide["d2t"] == state["d2t"]).all() and (wide["t2d"] == state["t2d"]).all()
    embeds, aux = rng.normal(size=(7, 24)), rng.normal(size=(7, 3 * 24))
    wide_embeds = np.zeros((7, 64))
    wide_embeds[:, :24] = embeds
    wide_aux = np.zeros((7, 3, 64))
    wide_aux[:, :, :24] = aux.reshape(7, 3, 24)
    small = eagle3_logits(state, config, embeds, aux)
    big = eagle3_logits(wide, cfg, wide_embeds, wide_aux.reshape(7, 3 * 64))
    assert small.shape == (7, 16)
    np.testing.assert_allclose(big, small, rtol=0, atol=1e-9)


def test_widening_refuses_a_narrower_shape() -> None:
    state = random_llama(np.random.default_rng(1))
    with pytest.raises(ValueError, match="narrower"):
        widen_llama(state, SMALL, TwinShape(hidden=16, heads=16, kv_heads=4, intermediate=96))
    with pytest.raises(ValueError, match="fewer than the source"):
        widen_llama(state, SMALL, TwinShape(hidden=64, heads=16, kv_heads=4, layers=1))
