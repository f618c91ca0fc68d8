"""A simulated fleet for benches: served in a subprocess, and the gateway config over it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.procs import Server, free_port
from bench.sim.profile import TWIN_PROFILE
from bench.sim.server import MODEL

TWIN_CONFIG = Path("config/gpu-twin.yaml")
SPECULATION = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4},
    "eagle3": {"method": "eagle3", "num_speculative_tokens": 3, "model": "twin-eagle3"},
}
#: ``max_batch_for_speculation`` of a simulated fleet's speculative backends where it differs
#: from the twin config's, which is set for the H100 the GPU runs get: the fleet simulates
#: H200s (the default profile, ``twin-2026-12-01.json``: EAGLE-3 alone 0.90x plain at c=8),
#: where a limit of 8 lost (eighth run, docs/benchmarks.md section 7; on this simulator,
#: 16 backends at c=64: 0.94, 0.96 and 1.01x plain against 0.99 and 1.01x with 4, session
#: 30, per-task choices splitting GPUs: section 7b).
FLEET_LIMITS = {"eagle3": 4}


def fleet_config(
    names: dict[str, str],
    urls: dict[str, str],
    groups: bool,
    twin: Path = TWIN_CONFIG,
    limits: Mapping[str, int] = FLEET_LIMITS,
    policy: str = "adaptive",
) -> dict[str, Any]:
    """The gateway config: ``twin``'s defaults, routing (``policy``: adaptive, or static as
    the GPU runs' static gateway) and rules, with the simulated backends ``names`` (backend
    -> kind) at ``urls``; each speculative backend keeps the twin config's per-backend
    settings of its kind, but the batch limits of ``limits`` (per kind; default
    :data:`FLEET_LIMITS`, ``{}``: the twin config's own, as on the H100 the GPU runs get)."""
    base = yaml.safe_load(twin.read_text())
    backends: dict[str, Any] = {}
    for name, kind in names.items():
        entry: dict[str, Any] = {"url": urls[name], "model": MODEL}
        if kind in SPECULATION:
            entry["speculation"] = SPECULATION[kind]
            for key in ("min_acceptance_rate", "max_batch_for_speculation"):
                if key in base["backends"].get(kind, {}):
                    entry[key] = base["backends"][kind][key]
            if kind in limits:
                entry["max_batch_for_speculation"] = limits[kind]
        if groups:
            entry["compute_group"] = "gpu" + name.rsplit("-g", 1)[1]
        backends[name] = entry
    routing = dict(base.get("routing", {})) | {"policy": policy}
    return {
        "defaults": base["defaults"],
        "routing": routing,
        "backends": backends,
        "pools": {
            "plain": [n for n, k in names.items() if k == "plain"],
            "speculative": [n for n, k in names.items() if k != "plain"],
        },
        "rules": base["rules"],
    }


@contextlib.contextmanager
def running_fleet(
    gpus: int,
    kinds: Sequence[str],
    scale: float,
    prompts: Path,
    per_task: int,
    logs: Path,
    profile: Path = TWIN_PROFILE,
    prefix_cache: bool = True,
) -> Iterator[dict[str, str]]:
    """The simulated fleet in a subprocess (costs from ``profile``, its servers' prefix
    caches on or off by ``prefix_cache``); yields backend name -> URL."""
    port = free_port()
    names = [f"{k}-g{g}" for g in range(gpus) for k in kinds]
    argv = [sys.executable, "-m", "bench.sim.server", "--port", str(port), "--scale", str(scale)]
    argv += ["--prompts", str(prompts), "--per-task", str(per_task), "--profile", str(profile)]
    for _ in range(gpus):
        argv += ["--gpu", ",".join(kinds)]
    if not prefix_cache:
        argv.append("--no-prefix-cache")
    # ports are consecutive from --port: the last one answering means all are up
    ready = f"http://127.0.0.1:{port + len(names) - 1}/health"
    with Server("sim-fleet", argv, ready_url=ready, log_path=logs / "sim-fleet.log"):
        yield {n: f"http://127.0.0.1:{port + i}" for i, n in enumerate(names)}
