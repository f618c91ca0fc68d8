"""EAGLE-3 data stages on Hugging Face transformers: self-distilled answers and hidden states.

Runs as a script in an environment that has torch and transformers (the vLLM venv here, the
GPU host's Python there); the gateway never imports it. It is the transformers engine of the
EAGLE-3 pipeline for hosts without a vLLM server (an air-gapped GPU host): the data it writes is
exactly what ``speculators`` (PyPI, vLLM project) reads, so ``speculators prepare-data`` and
``speculators train`` run unchanged on it.

Stages (each resumable: rerunning skips the work already on disk):

``distill``  prompts JSONL (``{"id", "messages"}`` per line) -> rows JSONL of speculators' own
             format ``{"id", "input_ids", "loss_mask"}``: the chat template's prompt tokens
             (mask 0) and the target's own answer (mask 1, ending with its end-of-turn token).
             Self-distillation: the draft learns the target's distribution, not a dataset's.
``hidden``   the prepared dataset (``speculators prepare-data`` output) -> one
             ``hs_{i}.safetensors`` per row, ``token_ids`` [seq] and ``hidden_states``
             [seq, len(layers) + 1, hidden]: the inputs of the decoder layers named by
             ``--layers`` (vLLM's EAGLE-3 "auxiliary layers", default (2, L/2, L-3)) and the
             last layer's output before the final norm (speculators' ``hs_connectors``
             FileTransfer layout; vLLM's extract_hidden_states gives the same tensors).
``strip``    removes the frozen copy of the target's embedding from a trained head
             (vLLM shares the target's embedding with an EAGLE-3 head that has none).

Prints one JSON summary line last, like ``backends/convert.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _progress(done: int, total: int, started: float, what: str) -> None:
    """One progress line with rate and ETA (seconds), on stderr."""
    spent = time.monotonic() - started
    rate = done / spent if spent > 0 else 0.0
    eta = (total - done) / rate if rate > 0 else float("inf")
    _log(f"{what}: {done}/{total} ({rate:.1f}/s, ETA {eta:.0f} s)")


def _device_and_dtype(name: str) -> tuple[Any, Any]:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return device, getattr(torch, name)


def _read_prompts(path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Yield ``(id, messages)``; a bad line raises ValueError naming the file and line."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                messages = item["messages"]
                if not isinstance(messages, list) or not messages:
                    raise ValueError("messages must be a non-empty list")
                yield str(item.get("id", number)), messages
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: bad prompt line: {exc}") from exc


def _done_ids(out: Path) -> set[str]:
    """Ids of the rows already in ``out``; a torn last line (no newline: an interrupted run)
    is cut off first, so the rows appended next start on a line of their own. A bad whole
    line raises ValueError naming ``file:line``."""
    if not out.exists():
        return set()
    raw = out.read_bytes()
    whole = raw[: raw.rfind(b"\n") + 1]
    if len(whole) != len(raw):
        with out.open("r+b") as handle:
            handle.truncate(len(whole))
    done = set()
    for number, line in enumerate(whole.decode("utf-8").splitlines(), 1):
        try:
            done.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{out}:{number}: bad row ({exc}); remove the file") from None
    return done


def _sampled(item_id: str, share: float) -> bool:
    """Deterministic per-prompt choice between greedy and sampled answers."""
    return (zlib.crc32(item_id.encode()) % 1000) < share * 1000


def distill(args: argparse.Namespace) -> dict[str, Any]:
    """Write the target's answers to ``args.prompts`` as speculators rows in ``args.out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.backends.cuda.matmul.allow_tf32 = True
    device, dtype = _device_and_dtype(args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])

    done = _done_ids(args.out)
    todo: list[tuple[str, list[int], bool]] = []
    skipped = 0
    for item_id, messages in _read_prompts(args.prompts):
        if item_id in done:
            continue
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        if len(ids) > args.max_prompt_tokens:
            skipped += 1
            continue
        todo.append((item_id, list(ids), _sampled(item_id, args.sample_share)))
        if args.limit and len(todo) + len(done) >= args.limit:
            break
    # Batches of one decoding mode and similar prompt length: little padding.
    todo.sort(key=lambda t: (t[2], len(t[1])))
    batches = [todo[i : i + args.batch_size] for i in range(0, len(todo), args.batch_size)]
    random.Random(0).shuffle(batches)  # a time budget then cuts an unbiased share
    _log(f"distill: {len(todo)} prompts to answer ({len(done)} done, {skipped} too long)")
    started, answered, tokens = time.monotonic(), 0, 0
    with args.out.open("a", encoding="utf-8") as sink:
        for batch in batches:
            if args.time_budget and time.monotonic() - started > args.time_budget:
                _log(f"distill: time budget {args.time_budget} s spent; rerun to go on")
                break
            width = max(len(ids) for _, ids, _ in batch)
            input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, (_, ids, _) in enumerate(batch):
                input_ids[row, width - len(ids) :] = torch.tensor(ids)
                mask[row, width - len(ids) :] = 1
            sample = batch[0][2]
            with torch.no_grad():
                out = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=mask.to(device),
                    max_new_tokens=args.max_new_tokens,
                    do_sample=sample,
                    temperature=args.temperature if sample else None,
                    top_p=0.95 if sample else None,
                    top_k=None,
                    pad_token_id=pad,
                )
            for row, (item_id, ids, _) in enumerate(batch):
                answer: list[int] = []
                for token in out[row, width:].tolist():
                    answer.append(token)
                    if token in eos_ids:
                        break
                if not answer:
                    continue
                line = {
                    "id": item_id,
                    "input_ids": ids + answer,
                    "loss_mask": [0] * len(ids) + [1] * len(answer),
                }
                sink.write(json.dumps(line) + "\n")
                tokens += len(ids) + len(answer)
            sink.flush()
            answered += len(batch)
            _progress(answered, len(todo), started, "distill")
    seconds = time.monotonic() - started
    return {
        "stage": "distill",
        "answered": answered,
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
    }


def _capture(model: Any, layers: list[int]) -> tuple[dict[int, Any], list[Any]]:
    """Hooks that store the inputs of ``layers`` and of the final norm (key -1)."""
    store: dict[int, Any] = {}
    handles = []
    decoder = model.model
    for index in layers:

        def pre(_mod: Any, args: Any, kwargs: Any, index: int = index) -> None:
            store[index] = (args[0] if args else kwargs["hidden_states"]).detach()

        handles.append(decoder.layers[index].register_forward_pre_hook(pre, with_kwargs=True))

    def pre_norm(_mod: Any, args: Any) -> None:
        store[-1] = args[0].detach()

    handles.append(decoder.norm.register_forward_pre_hook(pre_norm))
    return store, handles


def hidden(args: argparse.Namespace) -> dict[str, Any]:
    """Write ``hs_{i}.safetensors`` for every row of the prepared dataset ``args.data``."""
    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    device, dtype = _device_and_dtype(args.dtype)
    save_dtype = getattr(torch, args.save_dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    total_layers = model.config.num_hidden_layers
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    layers = layers or [2, total_layers // 2, total_layers - 3]
    store, handles = _capture(model, layers)
    data = load_from_disk(str(args.data)).with_format("torch")
    args.out.mkdir(parents=True, exist_ok=True)
    lengths = [int(x) for x in data.with_format(None)["seq_len"]]
    order = sorted(range(len(data)), key=lambda i: lengths[i])
    todo = [i for i in order if not (args.out / f"hs_{i}.safetensors").exists()]
    _log(f"hidden: {len(todo)} of {len(data)} rows to extract, layers {layers} + last")
    started, done, tokens, checked = time.monotonic(), 0, 0, False
    batch: list[int] = []

    def flush(batch: list[int]) -> None:
        nonlocal tokens, checked
        width = max(lengths[i] for i in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        rows = [data[i]["input_ids"] for i in batch]
        for r, row in enumerate(rows):
            ids[r, : len(row)] = row
            mask[r, : len(row)] = 1
        with torch.no_grad():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        stacked = torch.stack([store[k] for k in [*layers, -1]], dim=2)  # [b, seq, n+1, h]
        if not checked:  # the captured last state must give the model's own logits
            again = model.lm_head(model.model.norm(store[-1][:1]))
            agree = (again.argmax(-1) == logits[:1].argmax(-1)).float().mean().item()
            if agree < 0.99:
                raise RuntimeError(f"captured final state disagrees with logits ({agree:.3f})")
            checked = True
        for r, i in enumerate(batch):
            n = len(rows[r])
            save_file(
                {
                    "token_ids": rows[r].clone(),
                    "hidden_states": stacked[r, :n].to(save_dtype).cpu().contiguous(),
                },
                str(args.out / f"hs_{i}.safetensors"),
            )
            tokens += n

    flushes = 0
    for i in todo:
        batch.append(i)
        if sum(lengths[j] for j in batch) >= args.batch_tokens:
            flush(batch)
            done += len(batch)
            batch = []
            flushes += 1
            if flushes % 20 == 0:
                _progress(done, len(todo), started, "hidden")
    if batch:
        flush(batch)
        done += len(batch)
    for handle in handles:
        handle.remove()
    seconds = time.monotonic() - started
    return {
        "stage": "hidden",
        "rows": done,
        "tokens": tokens,
        "layers": layers,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
    }


def strip(args: argparse.Namespace) -> dict[str, Any]:
    """Drop ``embed_tokens`` from ``args.head``'s safetensors (rewritten atomically)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = args.head / "model.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata() or {}
        kept = {k: handle.get_tensor(k) for k in handle.keys() if "embed_tokens" not in k}  # noqa: SIM118
    before = path.stat().st_size
    tmp = path.with_suffix(".tmp")
    save_file(kept, str(tmp), metadata=meta)
    tmp.replace(path)
    params = sum(math.prod(t.shape) for t in kept.values())
    return {
        "stage": "strip",
        "bytes_before": before,
        "bytes_after": path.stat().st_size,
        "parameters": params,
        "tensors": sorted(kept),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    d = sub.add_parser("distill")
    d.add_argument("--model", type=Path, required=True)
    d.add_argument("--prompts", type=Path, required=True)
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--batch-size", type=int, default=256)
    d.add_argument("--max-new-tokens", type=int, default=320)
    d.add_argument("--max-prompt-tokens", type=int, default=1536)
    d.add_argument("--sample-share", type=float, default=0.5)
    d.add_argument("--temperature", type=float, default=0.7)
    d.add_argument("--limit", type=int, default=0)
    d.add_argument("--time-budget", type=float, default=0.0, help="seconds; 0: none")
    d.add_argument("--dtype", default="float32")
    h = sub.add_parser("hidden")
    h.add_argument("--model", type=Path, required=True)
    h.add_argument("--data", type=Path, required=True)
    h.add_argument("--out", type=Path, required=True)
    h.add_argument("--layers", default="")
    h.add_argument("--batch-tokens", type=int, default=32768)
    h.add_argument("--dtype", default="float32")
    h.add_argument("--save-dtype", default="bfloat16")
    s = sub.add_parser("strip")
    s.add_argument("--head", type=Path, required=True)
    args = parser.parse_args(argv)
    summary = {"distill": distill, "hidden": hidden, "strip": strip}[args.stage](args)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
