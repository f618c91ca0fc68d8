"""Convert a 2024-style vLLM command into the ``--speculative-config`` form and a profile.

vLLM 0.6 configured speculation with separate flags (``--speculative-model``,
``--num-speculative-tokens``, ``--ngram-prompt-lookup-max``, ...); current vLLM takes one
JSON object, ``--speculative-config '{"method": ..., ...}'``, and its parser rejects the old
flags. :func:`migrate` maps every token of an old command through explicit tables:

- :data:`SPEC_FLAGS`: old speculative flag -> ``--speculative-config`` key;
- :data:`DROPPED`: flags that no longer exist, each with the reason;
- :data:`PROFILE_FLAGS`: flags that become :class:`BackendProfile` fields (kept as they are in
  the new command);
- anything else passes through unchanged (``extra_args`` of the profile) and is listed.

Accepted launchers: ``vllm serve MODEL ...`` and ``python -m
vllm.entrypoints.openai.api_server --model MODEL ...``. Flag names may use ``_`` or ``-`` and
``--flag=value``, as vLLM's parser allows. Speculative method from ``--speculative-model``:
``[ngram]`` -> ngram, an id containing ``eagle3`` -> eagle3, ``eagle`` -> eagle (vLLM's own
name rule), any other model -> draft_model.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from backends.checks import head_method_from_name
from contracts.launch_profile import VLLM_SERVER_MODULE, BackendProfile, Speculation

Action = Literal["migrated", "dropped", "kept", "passed"]

#: Old speculative flag -> (``--speculative-config`` key, value parser).
SPEC_FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--speculative-model": ("model", str),
    "--num-speculative-tokens": ("num_speculative_tokens", int),
    "--ngram-prompt-lookup-max": ("prompt_lookup_max", int),
    "--ngram-prompt-lookup-min": ("prompt_lookup_min", int),
    "--speculative-draft-tensor-parallel-size": ("draft_tensor_parallel_size", int),
    "--speculative-model-quantization": ("quantization", str),
    "--speculative-max-model-len": ("max_model_len", int),
}

_V0 = "the V0 engine's speculative decoding was removed; current vLLM has no equivalent"
#: Removed flag -> (takes a value, why it is dropped).
DROPPED: dict[str, tuple[bool, str]] = {
    "--use-v2-block-manager": (False, "block manager v2 is the only one since vLLM 0.6.2"),
    "--speculative-disable-mqa-scorer": (False, _V0),
    "--speculative-disable-by-batch-size": (True, _V0),
    "--spec-decoding-acceptance-method": (True, "current vLLM uses rejection sampling only"),
    "--typical-acceptance-sampler-posterior-threshold": (True, "typical acceptance was removed"),
    "--typical-acceptance-sampler-posterior-alpha": (True, "typical acceptance was removed"),
    "--disable-logprobs-during-spec-decoding": (True, _V0),
    "--num-lookahead-slots": (True, "vLLM derives lookahead slots from the speculative config"),
}

#: Flags that become profile fields -> (field, value parser).
PROFILE_FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--model": ("model", str),
    "--served-model-name": ("served_model_name", str),
    "--host": ("host", str),
    "--port": ("port", int),
    "--dtype": ("dtype", str),
    "--tensor-parallel-size": ("tensor_parallel_size", int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--max-model-len": ("max_model_len", int),
    "--quantization": ("quantization", str),
}
_SHORT = {"-tp": "--tensor-parallel-size", "-q": "--quantization"}

#: Quantization names current vLLM accepts for a draft (vLLM's QuantizationMethods, abridged).
KNOWN_QUANTIZATIONS = frozenset(
    {"fp8", "fbgemm_fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors",
     "experts_int8", "modelopt", "modelopt_fp4", "mxfp4", "quark", "torchao", "moe_wna16",
     "bitsandbytes", "gguf", "int8_per_channel_weight_only"}
)  # fmt: skip


class MigrationError(ValueError):
    """The input is not a vLLM server command, or its speculative flags are inconsistent."""


@dataclass(frozen=True)
class Change:
    """What happened to one old flag: ``flag``, its ``value`` (or None), action, detail."""

    flag: str
    value: str | None
    action: Action
    detail: str

    def __str__(self) -> str:
        shown = self.flag if self.value is None else shlex.join([self.flag, self.value])
        return f"{self.action:<9}{shown}: {self.detail}"


@dataclass
class Migration:
    """The new command (argv), the equivalent profile, and every change made."""

    argv: list[str]
    profile: BackendProfile
    changes: list[Change]
    warnings: list[str] = field(default_factory=list)


def _split_launcher(tokens: list[str]) -> tuple[list[str], list[str], str | None]:
    """``(launcher tokens, rest, positional model)`` of a vLLM server command."""
    if len(tokens) >= 2 and tokens[0].rsplit("/", 1)[-1] == "vllm" and tokens[1] == "serve":
        rest = tokens[2:]
        if rest and not rest[0].startswith("-"):
            return tokens[:3], rest[1:], rest[0]
        return tokens[:2], rest, None
    if len(tokens) >= 3 and tokens[1] == "-m" and tokens[2] == VLLM_SERVER_MODULE:
        return tokens[:3], tokens[3:], None
    raise MigrationError(
        "not a vLLM server command: expected 'vllm serve MODEL ...' or "
        f"'python -m {VLLM_SERVER_MODULE} --model MODEL ...'"
    )


def _normalize(token: str) -> tuple[str, str | None]:
    """``--flag_name=v`` -> ``("--flag-name", "v")``; short aliases expanded."""
    name, eq, inline = token.partition("=")
    name = _SHORT.get(name, name)
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name, inline if eq else None


def _items(rest: list[str]) -> list[tuple[list[str], str, str | None]]:
    """Split argument tokens into ``(original tokens, normalized flag, value)`` items.

    Known flags take a value as their tables say; an unknown flag takes the next token when
    that token is not itself a flag.
    """
    items = []
    i = 0
    while i < len(rest):
        original = [rest[i]]
        flag, value = _normalize(rest[i])
        if flag in SPEC_FLAGS or flag in PROFILE_FLAGS:
            takes = True
        elif flag in DROPPED:
            takes = DROPPED[flag][0]
        else:
            takes = flag.startswith("-") and i + 1 < len(rest) and not rest[i + 1].startswith("-")
        if takes and value is None:
            if i + 1 >= len(rest):
                raise MigrationError(f"{flag} needs a value")
            value = rest[i + 1]
            original.append(value)
            i += 1
        items.append((original, flag, value))
        i += 1
    return items


def migrate(command: str | Sequence[str]) -> Migration:
    """Migrate one old command (a string, or argv tokens) to the current form.

    Raises :class:`MigrationError` when the command is not a vLLM server, has no model, a
    flag lacks its value, or the speculative flags do not form a valid config.
    """
    tokens = shlex.split(command) if isinstance(command, str) else list(command)
    launcher, rest, positional = _split_launcher(tokens)
    fields: dict[str, Any] = {"model": positional} if positional else {}
    spec: dict[str, Any] = {}
    kept: list[str] = []
    changes: list[Change] = []
    spec_at: int | None = None
    for original, flag, value in _items(rest):
        if flag in SPEC_FLAGS:
            key, parse = SPEC_FLAGS[flag]
            spec[key] = _parse(flag, value or "", parse)
            spec_at = len(kept) if spec_at is None else spec_at
            changes.append(Change(flag, value, "migrated", f"speculative config '{key}'"))
        elif flag in DROPPED:
            changes.append(Change(flag, value, "dropped", DROPPED[flag][1]))
        elif flag in PROFILE_FLAGS:
            key, parse = PROFILE_FLAGS[flag]
            fields[key] = _parse(flag, value or "", parse)
            kept += original
            changes.append(Change(flag, value, "kept", f"unchanged; profile field '{key}'"))
        else:
            kept += original
            fields.setdefault("extra_args", []).extend(original)
            detail = "not a speculative flag: kept as is (profile extra_args)"
            changes.append(Change(flag, value, "passed", detail))
    if "model" not in fields:
        raise MigrationError("the command names no model (--model or vllm serve MODEL)")
    speculation, warnings = _speculation(spec)
    method = f"speculative config 'method' {speculation.method!r}"
    changes = [
        Change(c.flag, c.value, c.action, method + (" and 'model'" if speculation.model else ""))
        if c.flag == "--speculative-model"
        else c
        for c in changes
    ]
    argv = list(launcher) + kept
    if speculation.speculative:
        config = json.dumps(speculation.to_config(), separators=(",", ":"))
        at = len(launcher) + (spec_at if spec_at is not None else len(kept))
        argv[at:at] = ["--speculative-config", config]
    return Migration(argv, _profile(fields, speculation), changes, warnings)


def _parse(flag: str, value: str, parse: Callable[[str], Any]) -> Any:
    try:
        return parse(value)
    except ValueError:
        raise MigrationError(f"{flag}: invalid value {value!r}") from None


def _speculation(spec: dict[str, Any]) -> tuple[Speculation, list[str]]:
    warnings = []
    model = spec.pop("model", None)
    if model is None and spec:
        raise MigrationError(f"speculative flags without --speculative-model: {sorted(spec)}")
    if model is not None:
        if model.strip().lower() == "[ngram]":
            spec["method"] = "ngram"
        else:
            spec["method"] = head_method_from_name(model) or "draft_model"
            spec["model"] = model
    quant = spec.get("quantization")
    if quant is not None and quant not in KNOWN_QUANTIZATIONS:
        warnings.append(
            f"draft quantization {quant!r} is not a quantization method of current vLLM, which "
            "rejects unknown methods at startup; use one it knows (e.g. fp8) or a pre-quantized "
            "draft"
        )
    try:
        return Speculation(**spec), warnings
    except ValidationError as exc:
        raise MigrationError(f"invalid speculative settings: {exc.errors()[0]['msg']}") from None


def _profile(fields: dict[str, Any], speculation: Speculation) -> BackendProfile:
    """vLLM's defaults where the command is silent: all interfaces, port 8000, the model id
    as served name."""
    fields.setdefault("served_model_name", fields["model"])
    fields.setdefault("host", "0.0.0.0")
    fields.setdefault("port", 8000)
    try:
        return BackendProfile(**fields, speculation=speculation)
    except ValidationError as exc:
        raise MigrationError(f"invalid server settings: {exc.errors()[0]['msg']}") from None


def profile_yaml(profile: BackendProfile) -> str:
    """The profile as YAML, fields left at their defaults omitted."""
    import yaml

    data = profile.model_dump(mode="json", exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False, width=100)
