"""The servers the overhead benchmark compares, each in front of the same fake upstream.

* ``direct``: the fake upstream itself (the baseline);
* ``specgate``: ``python -m cli serve`` (what ``specgate serve`` runs) with a config
  whose three backends (plain, ngram, draft) and rules are those of ``config/local.yaml``,
  pointed at three ports of the fake: routing, classifier, health polling and metrics
  scraping all on;
* ``bare-proxy``: :mod:`bench.bare_proxy`, the same stack as specgate with no routing
  (the floor of a Python gateway on uvicorn and aiohttp);
* ``vllm-router`` (Rust) and the ``litellm`` proxy, installed from PyPI into virtual
  environments of their own under ``<cache>/bench-venvs/`` on first use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.fake_upstream import MODEL
from bench.load import API_KEY
from contracts.paths import default_cache_dir

PATH = "/v1/chat/completions"
PROMPT = (
    "Write a Python function `merge_intervals(intervals: list[tuple[int, int]]) -> "
    "list[tuple[int, int]]` that merges overlapping closed intervals and returns them "
    "sorted by start. Include a docstring, type hints and three doctest examples, and "
    "explain its time complexity in one sentence."
)


#: Peer package requirements, installed into ``<cache>/bench-venvs/<name>``.
PEERS: dict[str, str] = {"vllm-router": "vllm-router", "litellm": "litellm[proxy]"}


@dataclass
class TargetSpec:
    """How to run one target: argv, environment, readiness URL (None for ``direct``)."""

    name: str
    port: int
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/health"
    version: str = ""

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:9200``."""
        return f"http://127.0.0.1:{self.port}"


def request_body(stream: bool) -> bytes:
    """A realistic routed request: a code question at temperature 0.2, 64 tokens."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0.2,
        "max_tokens": 64,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def venv_root() -> Path:
    """Where the peers' virtual environments live (``SPECGATE_CACHE_DIR`` respected)."""
    return default_cache_dir() / "bench-venvs"


def ensure_peer(name: str, log: Path) -> Path:
    """The peer's venv ``bin`` folder, creating the venv and installing the package first
    when its console script is missing (prints a progress line; output goes to ``log``)."""
    bin_dir = venv_root() / name / "bin"
    script = "litellm" if name == "litellm" else name
    if (bin_dir / script).exists():
        return bin_dir
    print(f"bench: installing {PEERS[name]} into {bin_dir.parent} (first run only)...", flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(bin_dir.parent)], check=True, stdout=out)
        subprocess.run(
            [str(bin_dir / "pip"), "install", "-q", PEERS[name]],
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return bin_dir


def package_version(bin_dir: Path, package: str) -> str:
    """The installed version of ``package`` in a venv (empty when unknown)."""
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run(
        [str(bin_dir / "python"), "-c", code], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def specgate_config(upstreams: Sequence[str]) -> dict[str, object]:
    """A specgate config like ``config/local.yaml`` (adaptive policy, one compute group) with
    remote backends at ``upstreams``."""
    plain, ngram, draft = upstreams
    spec_ngram = {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    spec_draft = {"method": "draft_model", "model": "draft", "num_speculative_tokens": 3}
    return {
        "defaults": {"temperature": 1.0, "task": "chat", "pool": "plain"},
        "routing": {"policy": "adaptive", "shared_compute_penalty": 0.25},
        "backends": {
            "plain": {"url": plain, "model": MODEL, "compute_group": "cpu"},
            "ngram": {
                "url": ngram,
                "model": MODEL,
                "speculation": spec_ngram,
                "max_batch_for_speculation": 4,
                "min_acceptance_rate": 0.15,
                "compute_group": "cpu",
            },
            "draft": {
                "url": draft,
                "model": MODEL,
                "speculation": spec_draft,
                "max_batch_for_speculation": 4,
                "compute_group": "cpu",
            },
        },
        "pools": {"plain": ["plain"], "speculative": ["ngram", "draft"]},
        "rules": [
            {
                "name": "creative-plain",
                "match": {"tasks": ["creative"]},
                "pool": "plain",
                "fallbacks": ["speculative"],
            },
            {
                "name": "hot-plain",
                "match": {"temperature": {"min": 0.8}},
                "pool": "plain",
                "fallbacks": ["speculative"],
            },
            {
                "name": "code-rag-speculative",
                "match": {"tasks": ["code", "rag"], "temperature": {"max": 0.6}},
                "pool": "speculative",
                "fallbacks": ["plain"],
            },
        ],
    }


def specgate_target(
    port: int,
    upstreams: Sequence[str],
    workdir: Path,
    env: Mapping[str, str] | None = None,
    variant_flags: Sequence[str] = (),
) -> TargetSpec:
    """``specgate serve`` as production runs it; ``env`` adds ``SPECGATE_*`` overrides;
    ``variant_flags`` (e.g. ``["--server", "granian"]``) run :mod:`bench.variants` instead."""
    path = workdir / "specgate-bench.yaml"
    path.write_text(yaml.safe_dump(specgate_config(upstreams), sort_keys=False))
    if variant_flags:
        argv = [sys.executable, "-m", "bench.variants", *variant_flags]
    else:
        argv = [sys.executable, "-m", "cli", "serve"]
    argv += ["--config", str(path), "--port", str(port)]
    # its learnt state in the run's own folder, never the shared cache
    env = {"SPECGATE_STATE_FILE": str(workdir / "specgate-state.json"), **(env or {})}
    return TargetSpec("specgate", port, argv, env, "/ready")


def bare_proxy_target(port: int, upstreams: Sequence[str]) -> TargetSpec:
    """:mod:`bench.bare_proxy` in front of the first upstream: specgate's stack (uvicorn,
    aiohttp) with no work of its own, the floor a Python gateway on it starts from."""
    argv = [sys.executable, "-m", "bench.bare_proxy", "--upstream", upstreams[0]]
    return TargetSpec("bare-proxy", port, [*argv, "--port", str(port)], {}, "/health")


def vllm_router_target(port: int, upstreams: Sequence[str], log: Path) -> TargetSpec:
    """vllm-router over the same upstreams, round robin (its cheapest policy)."""
    bin_dir = ensure_peer("vllm-router", log)
    argv = [str(bin_dir / "vllm-router"), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--policy", "round_robin", "--worker-urls", *upstreams]
    version = package_version(bin_dir, "vllm-router")
    return TargetSpec("vllm-router", port, argv, {}, "/health", version)


def litellm_target(port: int, upstreams: Sequence[str], workdir: Path, log: Path) -> TargetSpec:
    """The LiteLLM proxy with one ``openai/`` deployment per upstream (its load balancing)."""
    bin_dir = ensure_peer("litellm", log)
    model_list = [
        {
            "model_name": MODEL,
            "litellm_params": {
                "model": f"openai/{MODEL}",
                "api_base": f"{u}/v1",
                "api_key": "unused",
            },
        }
        for u in upstreams
    ]
    config = {
        "model_list": model_list,
        "litellm_settings": {"telemetry": False},
        "general_settings": {"master_key": API_KEY},
    }
    path = workdir / "litellm-bench.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [str(bin_dir / "litellm"), "--config", str(path), "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    version = package_version(bin_dir, "litellm")
    return TargetSpec("litellm", port, argv, env, "/health/liveliness", version)
