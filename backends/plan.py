"""``specgate backends plan``: per backend, the exact command, its GPUs, memory and problems.

:func:`plan_profiles` gathers, for each named profile, the shell-quoted vLLM command line
(``CUDA_VISIBLE_DEVICES`` and ``env`` first, then :func:`build_argv`), the GPUs it uses,
the per-GPU :class:`~backends.memory.MemoryEstimate`, and every
:class:`~backends.checks.Problem` of :func:`~backends.checks.check_profiles` plus memory.
:func:`render_plan` formats the result as text. No model is downloaded and nothing starts.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from backends.checks import ModelLookup, Problem, check_profiles
from backends.memory import MemoryEstimate, estimate_memory
from backends.models import resolve_model, resolve_profile
from contracts.launch_profile import BackendProfile, build_argv
from contracts.paths import CachePaths


@dataclass
class BackendPlan:
    """What one backend will run and need; ``memory`` is None for an unknown architecture."""

    name: str
    profile: BackendProfile
    command: str
    gpus: str
    memory: MemoryEstimate | None


@dataclass(frozen=True)
class SharedGpu:
    """One GPU that several backends share, and what they take of it together (GiB).

    ``parts``: (backend, GiB) per estimated sharer: ``expected_gib`` for a fixed KV cache,
    else its share ``gpu_memory_utilization x GPU`` (vLLM sizes itself to that fraction of
    the whole device, ``vllm serve --help``). ``unknown``: sharers not estimated (unknown
    architecture). ``sizes``: the GPU sizes (GiB) the sharers assume; ``shares_ok``: every
    sharer sets a share and they sum to <= 1 (else the pre-launch checks already refuse it).
    """

    node: str
    gpu: int
    parts: tuple[tuple[str, float], ...]
    unknown: tuple[str, ...]
    sizes: tuple[float, ...]
    shares_ok: bool

    @property
    def total_gib(self) -> float:
        return sum(gib for _, gib in self.parts)

    @property
    def gpu_gib(self) -> float:
        """The smallest size a sharer assumes."""
        return min(self.sizes)

    @property
    def verdict(self) -> str:
        """``fits``, ``DOES NOT FIT``, or why no verdict is given."""
        if len(set(self.sizes)) > 1:
            return "no verdict: the sharers assume different GPU sizes"
        if self.unknown:
            return f"no verdict: {', '.join(self.unknown)} not estimated"
        if not self.shares_ok:
            return "no verdict: the gpu_memory_utilization shares are refused (see problems)"
        return "fits" if self.total_gib <= self.gpu_gib else "DOES NOT FIT"


@dataclass
class Plan:
    """Every backend's plan and every problem found (checks first, then memory), and the
    GPUs that several backends share."""

    backends: list[BackendPlan]
    problems: list[Problem]
    shared: list[SharedGpu] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]


def command_line(profile: BackendProfile, python: str = "python") -> str:
    """The shell command that launches ``profile``: ``K=V ... python -m vllm... --model ...``."""
    env = [f"{k}={shlex.quote(v)}" for k, v in profile.launch_env.items()]
    return " ".join([*env, shlex.join(build_argv(profile, python))])


def describe_gpus(profile: BackendProfile) -> str:
    """E.g. ``"0,1 on node 'default'"`` or ``"unset: the first 2 visible GPU(s)"``."""
    if profile.gpus is None:
        return f"unset: the first {profile.tensor_parallel_size or 1} visible GPU(s)"
    return f"{','.join(map(str, profile.gpus))} on node '{profile.node or 'default'}'"


def plan_profiles(
    profiles: Mapping[str, BackendProfile],
    *,
    paths: CachePaths | None = None,
    lookup: ModelLookup | None = None,
    gpu_memory_gb: float = 80.0,
    concurrency: int = 4,
    python: str = "python",
) -> Plan:
    """Plan every profile; ``local:NAME`` models resolve against ``paths`` (default cache).

    ``gpu_memory_gb`` (GiB per GPU) and ``concurrency`` (full-length sequences) apply where a
    profile does not set ``gpu_memory_gb`` / ``expected_concurrency``.
    """
    paths = paths or CachePaths.default()
    look = lookup or ModelLookup(resolve=lambda ref: resolve_model(ref, paths))
    problems = check_profiles(profiles, look)
    plans = []
    for name, profile in profiles.items():
        resolved = resolve_profile(profile, paths)
        memory, found = estimate_memory(
            name, profile, look, gpu_memory_gb=gpu_memory_gb, concurrency=concurrency
        )
        problems += found
        plans.append(
            BackendPlan(
                name, profile, command_line(resolved, python), describe_gpus(profile), memory
            )
        )
    shared = shared_gpus(plans)
    return Plan(plans, problems + [p for g in shared for p in _shared_problems(g)], shared)


def shared_gpus(plans: list[BackendPlan]) -> list[SharedGpu]:
    """The GPUs (by node and index, from explicit ``gpus``) that two or more backends use,
    with each sharer's part (see :class:`SharedGpu`)."""
    users: dict[tuple[str, int], list[BackendPlan]] = {}
    for b in plans:
        for gpu in b.profile.gpus or []:
            users.setdefault((b.profile.node or "default", gpu), []).append(b)
    out = []
    for (node, gpu), group in users.items():
        if len(group) < 2:
            continue
        parts = tuple((b.name, _part_gib(b.memory)) for b in group if b.memory is not None)
        unknown = tuple(b.name for b in group if b.memory is None)
        sizes = tuple(sorted({b.memory.gpu_memory_gib for b in group if b.memory is not None}))
        shares = [b.profile.gpu_memory_utilization for b in group]
        shares_ok = all(x is not None for x in shares) and sum(x or 0 for x in shares) <= 1.0
        out.append(SharedGpu(node, gpu, parts, unknown, sizes or (0.0,), shares_ok))
    return out


def _part_gib(m: MemoryEstimate) -> float:
    return m.expected_gib if m.kv_fixed else m.budget_gib


def _shared_problems(g: SharedGpu) -> list[Problem]:
    where = f"GPU {g.gpu} on node '{g.node}'"
    if len(set(g.sizes)) > 1:
        sizes = " and ".join(f"{x:g}" for x in g.sizes)
        msg = f"{where} is shared by backends that assume different sizes ({sizes} GiB)"
        return [Problem(g.parts[-1][0], "gpu_memory_gb", msg)]
    if g.unknown or not g.shares_ok or g.total_gib <= g.gpu_gib:
        return []  # not estimated, or refused by the pre-launch checks already
    parts = " + ".join(f"{name} {gib:.2f}" for name, gib in g.parts)
    msg = (
        f"{where} is shared: {parts} = {g.total_gib:.2f} GiB, over the GPU's {g.gpu_gib:g} GiB"
        " (fixed KV caches count with the engine overhead, the others with their"
        " gpu_memory_utilization share): the last servers to start will not fit"
    )
    return [Problem(g.parts[-1][0], "gpus", msg)]


def _describe_backend(b: BackendPlan) -> str:
    spec = b.profile.speculation
    how = "plain" if not spec.speculative else f"{spec.method} k={spec.num_speculative_tokens}"
    if spec.model:
        how += f" with {spec.model}"
    return f"backend {b.name}: {b.profile.model} as '{b.profile.served_model_name}', {how}"


def _render_memory(m: MemoryEstimate) -> list[str]:
    lines = ["  memory per GPU (GiB):"]
    lines += [f"    {x.label:<16} {x.gib:7.2f}   {x.detail}" for x in m.lines]
    verdict = "fits" if m.need_gib <= m.budget_gib else "DOES NOT FIT"
    lines.append(
        f"    {'total':<16} {m.need_gib:7.2f}   of {m.budget_gib:.2f} = {m.gpu_memory_gib:g} GiB"
        f" x gpu_memory_utilization {m.utilization:g}: {verdict}"
        f" (headroom {m.budget_gib - m.need_gib:+.2f})"
    )
    lines.append(
        f"    {'expected':<16} {m.expected_gib:7.2f}   total + {m.overhead_gib:g} engine overhead"
        " (CUDA context, activations, CUDA graphs): what nvidia-smi shows"
        + ("" if m.kv_fixed else " once the KV cache is fixed (--kv-cache-memory-bytes)")
    )
    lines += [f"    note: {n}" for n in m.notes]
    return lines


def render_plan(plan: Plan) -> str:
    """The plan as text: one block per backend, then the problems and a summary line."""
    out: list[str] = []
    for b in plan.backends:
        out += [_describe_backend(b), f"  command: {b.command}", f"  gpus:    {b.gpus}"]
        out += _render_memory(b.memory) if b.memory else ["  memory:  not estimated"]
        out.append("")
    for g in plan.shared:
        parts = " + ".join(
            [f"{name} {gib:.2f}" for name, gib in g.parts]
            + [f"{name} (not estimated)" for name in g.unknown]
        )
        out.append(
            f"GPU {g.gpu} on node '{g.node}', shared (GiB): {parts} = {g.total_gib:.2f}"
            f" of {g.gpu_gib:g}: {g.verdict}"
        )
    if plan.shared:
        out.append("")
    if plan.problems:
        out.append("problems:")
        out += [f"  {p}" for p in plan.problems]
        out.append("")
    errors = len(plan.errors)
    warnings = len(plan.problems) - errors
    out.append(f"{len(plan.backends)} backend(s), {errors} error(s), {warnings} warning(s)")
    out.append(
        "total: weights + KV cache; expected adds the engine's overhead, measured on an H200 "
        "(backends.memory.ENGINE_OVERHEAD_GIB)"
    )
    return "\n".join(out)
