"""Checks before launch: will these backends start, and will their drafts be any good?

:func:`check_backends` (for a gateway config) and :func:`check_profiles` (for named profiles)
return every :class:`Problem` found, each naming the backend and the profile field:

- draft_model: the draft shares the target's vocabulary (vocab size, and the tokenizer
  vocabulary when both folders are local). vLLM refuses a draft_model whose vocab size
  differs (``verify_equal_vocab_size_if_draft_model``), and a draft of another family rarely
  passes 30% acceptance; ``allow_vocab_mismatch: true`` turns this into a warning.
- ``draft_tensor_parallel_size`` is 1 or the target's tensor-parallel size (vLLM's rule,
  ``SpeculativeConfig._verify_and_get_draft_tp``).
- eagle/eagle3: the head matches its target (:data:`KNOWN_HEADS`, plus hidden and vocab size
  from the configs when readable) and its method matches its name (vLLM tells ``EAGLE3`` heads
  from ``EAGLE-`` heads by name).
- mtp: the target has built-in MTP layers (``num_nextn_predict_layers`` in its config).
- GPU indices: at least tensor-parallel-size of them; one GPU of a node shared only when
  every sharer sets ``gpu_memory_utilization`` and the shares sum to at most 1.

Model facts come from :class:`ModelLookup`; nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from backends.model_info import ModelInfo, load_model_info, tokenizer_fingerprint
from contracts.config import GatewayConfig
from contracts.launch_profile import BackendProfile

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """One finding: ``backend`` name, ``field`` inside its profile (dotted), what is wrong."""

    backend: str
    field: str
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.severity}: backends.{self.backend}.profile.{self.field}: {self.message}"


class ModelLookup:
    """Cached ``ref -> ModelInfo | None`` over local folders, the HF cache and the table.

    ``resolve`` maps a profile reference to a path or hub id first (e.g. ``local:NAME`` to
    the prepared folder). A local ``config.json`` that cannot be parsed counts as unknown.
    """

    def __init__(
        self, resolve: Callable[[str], str] | None = None, hub_cache: Path | None = None
    ) -> None:
        self._resolve = resolve or (lambda ref: ref)
        self._hub_cache = hub_cache
        self._seen: dict[str, ModelInfo | None] = {}

    def __call__(self, ref: str) -> ModelInfo | None:
        if ref not in self._seen:
            try:
                self._seen[ref] = load_model_info(self._resolve(ref), self._hub_cache)
            except ValueError:
                self._seen[ref] = None
        return self._seen[ref]


class Head(NamedTuple):
    """A published EAGLE head: its method, the targets it was trained on, hidden and vocab."""

    method: str
    targets: tuple[str, ...]
    hidden_size: int
    vocab_size: int


_L31_8B = ("meta-llama/llama-3.1-8b-instruct", "meta-llama/meta-llama-3.1-8b-instruct")
#: Published heads by lower-case id (model cards of yuhuili/* and RedHatAI/*; vLLM docs).
KNOWN_HEADS: Mapping[str, Head] = {
    "yuhuili/eagle-llama3-instruct-8b": Head(
        "eagle", ("meta-llama/meta-llama-3-8b-instruct",), 4096, 128256
    ),
    "yuhuili/eagle-llama3.1-instruct-8b": Head("eagle", _L31_8B, 4096, 128256),
    "yuhuili/eagle-llama3-instruct-70b": Head(
        "eagle", ("meta-llama/meta-llama-3-70b-instruct",), 8192, 128256
    ),
    "yuhuili/eagle3-llama3.1-instruct-8b": Head("eagle3", _L31_8B, 4096, 128256),
    "redhatai/llama-3.1-8b-instruct-speculator.eagle3": Head("eagle3", _L31_8B, 4096, 128256),
    "yuhuili/eagle3-llama3.3-instruct-70b": Head(
        "eagle3", ("meta-llama/llama-3.3-70b-instruct",), 8192, 128256
    ),
    "yuhuili/eagle3-deepseek-r1-distill-llama-8b": Head(
        "eagle3", ("deepseek-ai/deepseek-r1-distill-llama-8b",), 4096, 128256
    ),
    "yuhuili/eagle-qwen2-7b-instruct": Head("eagle", ("qwen/qwen2-7b-instruct",), 3584, 152064),
}


def head_method_from_name(model: str) -> str | None:
    """``eagle3``/``eagle`` from a head's id the way vLLM guesses it, else None."""
    name = model.lower()
    return "eagle3" if "eagle3" in name else "eagle" if "eagle" in name else None


def check_backends(config: GatewayConfig, lookup: ModelLookup | None = None) -> list[Problem]:
    """Every problem of the config's backends that have a launch profile."""
    profiles = {n: b.profile for n, b in config.backends.items() if b.profile is not None}
    return check_profiles(profiles, lookup)


def check_profiles(
    profiles: Mapping[str, BackendProfile], lookup: ModelLookup | None = None
) -> list[Problem]:
    """Every problem of the named profiles, in backend order, GPU collisions last."""
    look = lookup or ModelLookup()
    problems: list[Problem] = []
    for name, profile in profiles.items():
        problems += _check_parallel(name, profile)
        method = profile.speculation.method
        if method == "draft_model":
            problems += _check_vocab(name, profile, look)
        elif method in ("eagle", "eagle3"):
            problems += _check_head(name, profile, look)
        elif method == "mtp":
            problems += _check_mtp(name, profile, look)
    return problems + _check_gpu_collisions(profiles)


def _check_parallel(name: str, p: BackendProfile) -> list[Problem]:
    tp = p.tensor_parallel_size or 1
    out = []
    draft_tp = p.speculation.draft_tensor_parallel_size
    if draft_tp is not None and draft_tp not in (1, tp):
        msg = f"is {draft_tp}; vLLM accepts 1 or the target's tensor_parallel_size ({tp})"
        out.append(Problem(name, "speculation.draft_tensor_parallel_size", msg))
    if p.gpus is not None and len(p.gpus) < tp:
        msg = f"lists {len(p.gpus)} GPU(s) but tensor_parallel_size is {tp}"
        out.append(Problem(name, "gpus", msg))
    elif p.gpus is not None and len(p.gpus) > tp:
        msg = f"lists {len(p.gpus)} GPUs; with tensor_parallel_size {tp} only {tp} are used"
        out.append(Problem(name, "gpus", msg, "warning"))
    return out


def _unknown(name: str, field: str, what: str, refs: list[str]) -> Problem:
    msg = f"cannot check {what}: no local config.json and not in the built-in table: " + (
        ", ".join(refs)
    )
    return Problem(name, field, msg, "warning")


def _check_vocab(name: str, p: BackendProfile, look: ModelLookup) -> list[Problem]:
    draft_ref = p.speculation.model or ""
    target, draft = look(p.model), look(draft_ref)
    if target is None or draft is None:
        missing = [r for r, i in ((p.model, target), (draft_ref, draft)) if i is None]
        return [_unknown(name, "speculation.model", "the draft's vocabulary", missing)]
    severity: Severity = "warning" if p.allow_vocab_mismatch else "error"
    advice = (
        " (allowed by allow_vocab_mismatch)"
        if p.allow_vocab_mismatch
        else "; a draft from another model family rarely passes 30% acceptance "
        "(set allow_vocab_mismatch: true to override)"
    )
    if target.vocab_size != draft.vocab_size:
        msg = (
            f"draft vocab_size {draft.vocab_size} ({draft.model_type}) differs from the "
            f"target's {target.vocab_size} ({target.model_type}); vLLM refuses a draft_model "
            f"with another vocabulary size" + advice
        )
        return [Problem(name, "speculation.model", msg, severity)]
    try:
        prints = tokenizer_fingerprint(target.folder), tokenizer_fingerprint(draft.folder)
    except (OSError, ValueError, KeyError, TypeError):
        prints = None, None
    if None not in prints and prints[0] != prints[1]:
        msg = "draft and target tokenizers map tokens to different ids" + advice
        return [Problem(name, "speculation.model", msg, severity)]
    return []


def _check_head(name: str, p: BackendProfile, look: ModelLookup) -> list[Problem]:
    spec = p.speculation
    head_ref = spec.model or ""
    out: list[Problem] = []
    known = KNOWN_HEADS.get(head_ref.lower())
    by_name = known.method if known else head_method_from_name(head_ref)
    if by_name is not None and by_name != spec.method:
        msg = f"'{head_ref}' is an {by_name} head but method is '{spec.method}'"
        out.append(Problem(name, "speculation.method", msg))
    if known and p.model.lower() not in known.targets:
        better = [h for h, k in KNOWN_HEADS.items() if p.model.lower() in k.targets]
        msg = (
            f"'{head_ref}' was trained for {known.targets[0]}, not {p.model}; "
            "expect lower acceptance"
            + (f" (known heads for it: {', '.join(better)})" if better else "")
        )
        out.append(Problem(name, "speculation.model", msg, "warning"))
    target, head = look(p.model), look(head_ref)
    head_hidden = head.hidden_size if head else known.hidden_size if known else None
    head_vocab = head.vocab_size if head else known.vocab_size if known else None
    if target is None or head_hidden is None:
        missing = [r for r, ok in ((p.model, target), (head_ref, head_hidden)) if not ok]
        return out + [_unknown(name, "speculation.model", "the head against its target", missing)]
    for what, mine, theirs in (
        ("hidden_size", head_hidden, target.hidden_size),
        ("vocab_size", head_vocab, target.vocab_size),
    ):
        if mine is not None and theirs is not None and mine != theirs:
            msg = f"head {what} {mine} does not match the target's {theirs}: it cannot load"
            out.append(Problem(name, "speculation.model", msg))
    return out


def _check_mtp(name: str, p: BackendProfile, look: ModelLookup) -> list[Problem]:
    target = look(p.model)
    if target is None:
        return [_unknown(name, "speculation.method", "the target's MTP layers", [p.model])]
    layers = target.get("num_nextn_predict_layers") or target.get("mtp_num_hidden_layers")
    if not layers:
        msg = f"{p.model} ({target.model_type}) has no built-in MTP layers"
        return [Problem(name, "speculation.method", msg)]
    return []


_PROFILING_RACE = (
    "GPU {gpu} on node '{node}' is shared and this server's KV cache is sized from its "
    "gpu_memory_utilization share: vLLM's startup memory profiling counts the other servers' "
    "allocations, so servers starting together can fail with 'No available memory for the "
    "cache blocks'; fix the cache with extra_args [--kv-cache-memory-bytes, SIZE]"
)


def _check_gpu_collisions(profiles: Mapping[str, BackendProfile]) -> list[Problem]:
    """Backends on the same GPU of the same node may share it when each sets its share
    (``gpu_memory_utilization``) and the shares sum to at most 1.0 (vLLM sizes its memory
    from that fraction of the whole device, ``vllm serve --help``); otherwise an error on
    every backend after the GPU's first. Sharers whose KV cache is not fixed
    (``--kv-cache-memory-bytes``) get a warning: seen on an H200 with vLLM 0.26, four servers
    starting together at 0.1 each failed their memory profiling (docs/benchmarks.md, section 5).
    """
    sharers: dict[tuple[str, int], list[str]] = {}
    for name, p in profiles.items():
        for gpu in p.gpus or []:
            sharers.setdefault((p.node or "default", gpu), []).append(name)
    out = []
    for (node, gpu), names in sharers.items():
        if len(names) < 2:
            continue
        shares = [profiles[n].gpu_memory_utilization for n in names]
        if all(s is not None for s in shares) and sum(s or 0 for s in shares) <= 1.0:
            out += [
                Problem(n, "extra_args", _PROFILING_RACE.format(gpu=gpu, node=node), "warning")
                for n in names
                if "--kv-cache-memory-bytes" not in " ".join(profiles[n].extra_args)
            ]
            continue
        unset = [n for n, s in zip(names, shares, strict=True) if s is None]
        why = (
            f"without a gpu_memory_utilization share ({', '.join(unset)})"
            if unset
            else f"with gpu_memory_utilization summing to {sum(s or 0 for s in shares):g} > 1"
        )
        for name in names[1:]:
            msg = f"GPU {gpu} on node '{node}' is also used by backend '{names[0]}' {why}"
            out.append(Problem(name, "gpus", msg))
    return out
