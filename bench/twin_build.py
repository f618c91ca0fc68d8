"""Build the cost twin (:mod:`bench.twin`) and its EAGLE-3 head on a GPU host, checked in fp32.

    python -m bench.twin_build --source $CACHE/models/smollm2-135m-instruct \\
        --head backends/drafts/heads/smollm2-135m-eagle3 --out $CACHE/models

Needs torch, transformers and safetensors (the H200 host's image has them) and a CUDA GPU for
the checks. ``--source`` is the fp32 folder ``specgate models prepare`` builds from the GGUF;
writes ``OUT/smollm2-twin-5b7`` (bf16, tied embedding, the source's tokenizer) and
``OUT/smollm2-twin-5b7-eagle3`` (bf16 head, speculators format, no embedding: vLLM shares the
twin's), then prints one JSON line: parameters, seconds, and the fp32 checks

- ``greedy_identical``: of ``len(PROMPTS)`` chat prompts, how many give the same
  ``--new-tokens`` greedy tokens from the twin and the 135M (transformers, fp32, GPU);
- ``max_logit_diff``: max |twin - 135M| over every logit of those sequences;
- ``reference_diff``: max |numpy reference forward - transformers| on the 135M (one prompt),
  which shows :func:`bench.twin.llama_logits` is the model transformers runs;
- ``head_max_diff`` / ``head_argmax_same``: the head's draft logits (numpy, fp32) on the 135M's
  hidden states of layers 2, 15, 27 and the widened head's on the twin's, same tokens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.twin import TwinShape, eagle3_logits, llama_logits, widen_eagle3, widen_llama

TWIN = "smollm2-twin-5b7"
TWIN_HEAD = TWIN + "-eagle3"
PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain why the sky is blue in two sentences.",
    "Give me three tips for a job interview.",
    "Translate 'good morning, how are you?' into Spanish.",
    "Write a haiku about autumn leaves.",
    "What is 17 times 23? Show your work.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)


def _load(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a float32 (or integer/bool) numpy array."""
    from safetensors.torch import load_file

    out = {}
    for key, t in load_file(str(path)).items():
        out[key] = (t.float() if t.is_floating_point() else t).numpy()
    return out


def _save(state: dict[str, np.ndarray], path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {
        k: torch.from_numpy(v).to(torch.bfloat16) if v.dtype == np.float32 else torch.from_numpy(v)
        for k, v in state.items()
    }
    save_file(tensors, str(path), metadata={"format": "pt"})


def _check_twin(
    source: Path, wide: dict[str, np.ndarray], cfg: dict[str, Any], new: int
) -> dict[str, Any]:
    """fp32 checks on the GPU; returns the figures and the hidden states the head check uses."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(source)
    small = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(dev).eval()
    with torch.device(dev):
        twin = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), dtype=torch.float32).eval()
    missing = twin.load_state_dict({k: torch.from_numpy(v) for k, v in wide.items()}, strict=False)
    if missing.unexpected_keys or [k for k in missing.missing_keys if k != "lm_head.weight"]:
        raise RuntimeError(f"twin state mismatch: {missing}")
    twin.tie_weights()
    same, max_diff, seqs = 0, 0.0, []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok.apply_chat_template(
                [{"role": "user", "content": prompt}],
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=True,
            )["input_ids"].to(dev)
            a = small.generate(ids, max_new_tokens=new, do_sample=False)
            b = twin.generate(ids, max_new_tokens=new, do_sample=False)
            same += int(a.shape == b.shape and bool((a == b).all()))
            diff = (small(a).logits - twin(a).logits).abs().max().item()
            max_diff = max(max_diff, diff)
            seqs.append(a[0].tolist())
        ref_ids = seqs[0]
        ref = llama_logits(
            _load(source / "model.safetensors"),
            json.loads((source / "config.json").read_text()),
            ref_ids,
        )
        hf = small(torch.tensor([ref_ids]).to(dev)).logits[0].cpu().numpy()
        hs_small = small(torch.tensor([ref_ids]).to(dev), output_hidden_states=True).hidden_states
        hs_twin = twin(torch.tensor([ref_ids]).to(dev), output_hidden_states=True).hidden_states
    states = {
        "small": [h[0].cpu().numpy() for h in hs_small],
        "twin": [h[0].cpu().numpy() for h in hs_twin],
    }
    del twin, small
    torch.cuda.empty_cache()
    return {
        "greedy_identical": f"{same}/{len(PROMPTS)}",
        "new_tokens": new,
        "max_logit_diff": max_diff,
        "reference_diff": float(np.abs(ref - hf).max()),
        "_ids": ref_ids,
        "_states": states,
    }


def _check_head(
    head: dict[str, np.ndarray],
    head_cfg: dict[str, Any],
    wide: dict[str, np.ndarray],
    wide_cfg: dict[str, Any],
    src_embed: np.ndarray,
    twin_embed: np.ndarray,
    checked: dict[str, Any],
) -> dict[str, Any]:
    ids, states = checked["_ids"], checked["_states"]
    layers = head_cfg.get("eagle_aux_hidden_state_layer_ids", [2, 15, 27])
    nxt = np.asarray(ids[1:])
    small = eagle3_logits(
        head,
        head_cfg,
        src_embed[nxt],
        np.concatenate([states["small"][i][:-1] for i in layers], -1),
    )
    big = eagle3_logits(
        wide,
        wide_cfg,
        twin_embed[nxt],
        np.concatenate([states["twin"][i][:-1] for i in layers], -1),
    )
    return {
        "head_positions": int(len(nxt)),
        "head_max_diff": float(np.abs(small - big).max()),
        "head_argmax_same": f"{int((small.argmax(-1) == big.argmax(-1)).sum())}/{len(nxt)}",
    }


def build(
    source: Path, head_dir: Path, out: Path, new_tokens: int, shape: TwinShape
) -> dict[str, Any]:
    """Widen, check and write the twin and its head; return the summary (see module doc)."""
    started = time.monotonic()
    config = json.loads((source / "config.json").read_text())
    wide, cfg = widen_llama(_load(source / "model.safetensors"), config, shape)
    summary: dict[str, Any] = {
        "shape": shape.__dict__,
        "parameters": int(sum(v.size for k, v in wide.items())),
        "widen_s": round(time.monotonic() - started, 1),
    }
    checked = _check_twin(source, wide, cfg, new_tokens)
    head_cfg = json.loads((head_dir / "config.json").read_text())
    head = _load(head_dir / "model.safetensors")
    wide_head, wide_head_cfg = widen_eagle3(head, head_cfg, shape)
    summary |= _check_head(
        head,
        head_cfg,
        wide_head,
        wide_head_cfg,
        _load(source / "model.safetensors")["model.embed_tokens.weight"],
        wide["model.embed_tokens.weight"],
        checked,
    )
    summary |= {k: v for k, v in checked.items() if not k.startswith("_")}
    twin_dir, head_out = out / TWIN, out / TWIN_HEAD
    for folder in (twin_dir, head_out):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    _save(wide, twin_dir / "model.safetensors")
    cfg["dtype"] = "bfloat16"
    cfg.pop("torch_dtype", None)
    (twin_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, twin_dir / name)
    _save(wide_head, head_out / "model.safetensors")
    (head_out / "config.json").write_text(json.dumps(wide_head_cfg, indent=2) + "\n")
    summary["seconds"] = round(time.monotonic() - started, 1)
    (twin_dir / "twin.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    """CLI entry (see the module doc); exit code 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="the 135M's fp32 HF folder")
    parser.add_argument("--head", type=Path, required=True, help="its EAGLE-3 head folder")
    parser.add_argument("--out", type=Path, required=True, help="models folder to write into")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=TwinShape().layers, help="depth")
    parser.add_argument("--hidden", type=int, default=TwinShape().hidden, help="width")
    parser.add_argument("--heads", type=int, default=TwinShape().heads)
    parser.add_argument("--kv-heads", type=int, default=TwinShape().kv_heads)
    parser.add_argument("--intermediate", type=int, default=TwinShape().intermediate)
    args = parser.parse_args(argv)
    shape = TwinShape(args.hidden, args.heads, args.kv_heads, args.intermediate, args.layers)
    summary = build(args.source, args.head, args.out, args.new_tokens, shape)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
