"""Convert a GGUF causal LM into a plain fp32 Hugging Face folder that vLLM can serve.

Runs INSIDE the vLLM venv as a script (``python backends/convert.py --gguf F --out D``); it
imports torch and transformers only in :func:`convert`, so the gateway may import this module
harmlessly but never runs it in-process. Recipe (../shared/notes/vllm-cpu.md): transformers loads
the GGUF (dequantized), refuses to save it ("quantized with GGUF"), so a plain model is rebuilt
from the config without ``quantization_config`` and gets the state dict (strict: no missing or
unexpected keys). ``--layers N`` keeps the first N decoder layers (+ embeddings, final norm and
tied head), which makes a small, same-tokenizer draft model. Prints one JSON summary line last.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

_LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_CHECK_PROMPT = "What is the capital of France?"


def _keep_first_layers(state: dict[str, Any], layers: int) -> dict[str, Any]:
    """The state dict without decoder layers numbered ``layers`` and above."""
    kept = {}
    for key, value in state.items():
        match = _LAYER_KEY.search(key)
        if match is None or int(match.group(1)) < layers:
            kept[key] = value
    return kept


def _truncate_config(config: Any, layers: int) -> None:
    total = config.num_hidden_layers
    if not 1 <= layers <= total:
        raise SystemExit(f"--layers must be between 1 and {total}, got {layers}")
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:layers]


def _greedy_check(model: Any, tokenizer: Any, max_new_tokens: int = 12) -> str:
    import torch

    messages = [{"role": "user", "content": _CHECK_PROMPT}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def convert(
    gguf: Path, out: Path, layers: int | None = None, check: bool = False
) -> dict[str, Any]:
    """Write the fp32 safetensors model, config and tokenizer of ``gguf`` into ``out``.

    Returns a summary: ``{"architecture", "layers", "hidden_size", "vocab_size",
    "parameters", "seconds", "check"}``. Raises RuntimeError if the state dict does not fit
    the rebuilt model exactly, SystemExit for a bad ``layers``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # tqdm's carriage returns garble line-wise logs
    started = time.monotonic()
    src, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = {k: v.to(torch.float32) for k, v in loaded.state_dict().items()}
    del loaded
    if layers is not None:
        _truncate_config(config, layers)
        state = _keep_first_layers(state, layers)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(
            f"state dict mismatch: missing {result.missing_keys}, "
            f"unexpected {result.unexpected_keys}"
        )
    model.tie_weights()
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "architecture": type(model).__name__,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.monotonic() - started, 1),
        "check": _greedy_check(model, tokenizer) if check else None,
    }


def main(argv: list[str] | None = None) -> int:
    """CLI entry: ``--gguf FILE --out DIR [--layers N] [--check]``; exit code 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True, help="the .gguf file")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--layers", type=int, help="keep only the first N decoder layers")
    parser.add_argument("--check", action="store_true", help="greedy-answer a test prompt")
    args = parser.parse_args(argv)
    if not args.gguf.is_file():
        parser.error(f"no such file: {args.gguf}")
    summary = convert(args.gguf, args.out, layers=args.layers, check=args.check)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
