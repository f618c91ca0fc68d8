"""specgate (adaptive policy) in front of a simulated GPU fleet: routing at fleet scale, no GPU.

    python -m bench.sim_fleet [--gpus 5] [--kinds plain,ngram,eagle3] [--scale 10] \
        [--concurrency 16,64,128,256] [--per-task 64] [--warmup 20] [--out bench/out/sim-fleet] \
        [--profile bench/sim/twin-2026-12-01.json] [--no-prefix-cache] [--static] \
        [--quiet-gateways 5]

Starts, in one subprocess, ``--gpus`` simulated GPUs each running one simulated vLLM server
of each of ``--kinds`` (:mod:`bench.sim.server`, the cost twin's profile, or ``--profile``'s,
e.g. ``bench/sim/twin-2026-12-02.json``, fitted to a later run: 5 x 3 = 15
backends by default, steps of the servers of one GPU time-sliced as the twin's were), and the
real gateway (``python -m cli serve``) on a config made from ``config/gpu-twin.yaml``: its
rules and ``routing`` with ``policy: adaptive``, the simulated backends in its pools
(``plain``: every plain server; ``speculative``: every EAGLE-3 and ngram server) and each
backend's ``compute_group`` set to its GPU (``--no-compute-groups`` leaves it out).

Then, as ``bench.speedup`` does, the sample of the shared prompt datasets (``--per-task``
prompts a task, near-greedy code and rag, warm chat, hot creative, 64 tokens max) goes in
waves of ``c`` requests (each in a shuffled order, the same for every target) to every
target in turn: one target per kind, that kind's servers alone with the wave dealt
round-robin over them (one per GPU: the fleet deployed with that
kind only, the oracle's candidates), and ``specgate``, the gateway over all of them after
``--warmup`` requests a task one at a time. ``--router`` adds ``relay-vllm-router``:
vllm-router (round robin, installed from PyPI on first use as ``bench.overhead`` installs
it) over the plain servers, the same dealing through a relay, as a plain fleet's clients
would reach it: what relaying alone costs at that load, measured in the same run.
``--static`` adds ``static``: a second gateway on the same config with ``policy: static``
(the rules and the batch limits; in a pool the least loaded candidate, nothing learnt), as
the GPU runs measure beside the adaptive one, each wave sent to it before ``specgate``.
``--quiet-gateways S`` has each gateway's wave wait, up to S real seconds, until it counts
no other clients' request (:func:`bench.speedup.wait_quiet`; each run's ``quiet_wait_s`` in
simulated seconds). The
report (``bench.speedup_report``: ``speedup.md``, ``results.json``, charts) gives per
(task, c) each target's tokens/s and specgate's ratio to the best single kind (the oracle)
and to plain.

Each wave goes to the targets in a fixed order, specgate last, so with the servers' prefix
caches on (the default) specgate's requests find their prompts cached by the targets before
it on the same servers and skip their prefill (long rag prompts most);
``--no-prefix-cache`` runs the servers without it, so every target of a wave pays the same
prefill, as ``bench.speedup --no-prefix-cache`` does on GPUs (the report records which).

Time: the simulated servers run ``--scale`` real seconds per simulated second (default 10,
so 2 shared cores can relay and parse every chunk); the times reported are divided by it,
so they read as the GPU's. The acceptance and step costs are the twin's (vLLM 0.26, H200,
docs/benchmarks.md section 7); the ratios are those the calibration reproduces
(``bench.sim_calibrate``), not new GPU measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from tqdm import tqdm

from bench import adaptive_bench, speedup_report
from bench.llm_client import Outcome, run_items, run_spread
from bench.procs import Server, free_port, interrupt_on_sigterm
from bench.sim.fleet import FLEET_LIMITS, SPECULATION, fleet_config, running_fleet
from bench.sim.profile import TWIN_PROFILE
from bench.sim.server import MODEL
from bench.speedup import _Run, acceptance, wait_quiet, waits_for_quiet
from bench.speedup_report import RELAY
from bench.targets import vllm_router_target
from bench.workloads import WAVES, Item, default_prompts_dir, sample, unseeded, waves
from contracts.config import parse_config
from contracts.vllm_metrics import parse_vllm_metrics
from gateway.upstream.state import PEAK_WINDOW_S


def scrape(urls: dict[str, str]) -> dict[str, tuple[float, float] | None]:
    """(draft tokens, accepted tokens) per backend now (None for plain)."""
    out: dict[str, tuple[float, float] | None] = {}
    for name, url in urls.items():
        spec = parse_vllm_metrics(httpx.get(url + "/metrics", timeout=10).text).spec
        out[name] = None if spec is None else (spec.draft_tokens, spec.accepted_tokens)
    return out


def by_kind(acc: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Acceptance deltas summed over the servers of each kind (``eagle3-g0`` -> ``eagle3``)."""
    out: dict[str, dict[str, float]] = {}
    for name, a in acc.items():
        total = out.setdefault(name.rsplit("-g", 1)[0], {"draft_tokens": 0, "accepted_tokens": 0})
        total["draft_tokens"] += a["draft_tokens"]
        total["accepted_tokens"] += a["accepted_tokens"]
    for total in out.values():
        drafted = total["draft_tokens"]
        total["rate"] = total["accepted_tokens"] / drafted if drafted else float("nan")
    return out


def rescaled(outcomes: Sequence[Outcome], scale: float) -> list[Outcome]:
    """``outcomes`` with their times divided by ``scale`` (simulated seconds)."""
    for o in outcomes:
        o.ttft_s = None if o.ttft_s is None else o.ttft_s / scale
        o.e2e_s = None if o.e2e_s is None else o.e2e_s / scale
        if o.backend:
            o.backend = o.backend.rsplit("-g", 1)[0]  # routed per kind, not per server
    return list(outcomes)


def measure(
    targets: dict[str, list[str]],
    urls: dict[str, str],
    items: Sequence[Item],
    concurrencies: Sequence[int],
    max_tokens: int,
    scale: float,
    runs: list[dict[str, Any]],
    dealing: str = "mixed",
    quiet_s: float = 0.0,
) -> None:
    """Every (concurrency, target) run into ``runs`` (bench.speedup's shape): waves of c
    items (:func:`~bench.workloads.waves`, ``dealing`` mixed or per-task, the same for every
    target), each wave to every target in turn (fixed order: simulated servers have no
    spinning threads to favour one); ``quiet_s`` > 0: before a gateway's wave, wait for its
    quiet as ``bench.speedup --quiet-gateways`` does (:func:`bench.speedup.wait_quiet`, real
    seconds)."""
    total = len(concurrencies) * len(targets) * len(items)
    with tqdm(total=total, desc="sim-fleet", unit="req") as bar:
        for c in concurrencies:
            acc = {name: _Run(name, c) for name in targets}
            for wave in waves(unseeded(items), c, dealing):
                for name, bases in targets.items():
                    bar.set_postfix_str(f"c{c} {name}")
                    time.sleep(0.05 * scale)  # the twin run's --settle 0.05
                    if quiet_s > 0 and waits_for_quiet(name):
                        acc[name].quiet_wait_s += wait_quiet(bases[0], quiet_s) / scale
                    before = scrape(urls)
                    if len(bases) == 1:
                        out, wall = run_items(
                            bases[0], MODEL, wave, concurrency=c, max_tokens=max_tokens,
                            on_done=lambda _: bar.update(),
                        )  # fmt: skip
                    else:
                        out, wall = run_spread(
                            bases, MODEL, wave, concurrency=c, max_tokens=max_tokens,
                            on_done=lambda _: bar.update(),
                        )  # fmt: skip
                    delta = by_kind(acceptance(before, scrape(urls)))
                    acc[name].add(rescaled(out, scale), wall / scale, delta)
            for run in acc.values():
                runs.append(run.to_json())


def _limits(given: Sequence[str], kinds: Sequence[str]) -> dict[str, int]:
    """``--limit KIND=N`` arguments as {kind: N}. Raises ValueError for a malformed one, a
    kind not among the speculative ``kinds`` or N below 1."""
    out = {}
    for text in given:
        kind, _, n = text.partition("=")
        if kind not in kinds or kind not in SPECULATION or not n.isascii() or not n.isdigit():
            raise ValueError(f"--limit {text!r}: want KIND=N, KIND a speculative kind of --kinds")
        if int(n) < 1:
            raise ValueError(f"--limit {text!r}: N must be at least 1")
        out[kind] = int(n)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=5)
    parser.add_argument("--kinds", default="plain,ngram,eagle3", help="servers on each GPU")
    parser.add_argument("--scale", type=float, default=10.0, help="real s per simulated s")
    parser.add_argument("--concurrency", default="16,64,128,256")
    parser.add_argument("--per-task", type=int, default=64)
    parser.add_argument("--waves", choices=WAVES, default="mixed", help="mixed, or one task a wave")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=20, help="adaptive warm-up per task")
    parser.add_argument("--prompts", type=Path, default=default_prompts_dir())
    parser.add_argument("--no-compute-groups", action="store_true")
    parser.add_argument(
        "--twin-limits",
        action="store_true",
        help="keep config/gpu-twin.yaml's max_batch_for_speculation (the H100 runs' config) "
        "instead of the fleet's (bench.sim.fleet.FLEET_LIMITS, set for the H200 profile)",
    )
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="KIND=N",
        help="max_batch_for_speculation N for the servers of KIND (after --twin-limits); "
        "repeatable",
    )
    parser.add_argument("--profile", type=Path, default=TWIN_PROFILE, help="fitted costs")
    parser.add_argument(
        "--router",
        action="store_true",
        help="add relay-vllm-router: vllm-router (PyPI, Rust, round robin) over the plain "
        "servers, what a plain fleet's clients reach them through",
    )
    parser.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="simulated servers without prefix caching: every request pays its whole prefill",
    )
    parser.add_argument(
        "--static",
        action="store_true",
        help="add static: the same config with policy static, as the GPU runs' static gateway",
    )
    parser.add_argument(
        "--quiet-gateways",
        type=float,
        default=0.0,
        metavar="S",
        help="as bench.speedup's: before a gateway's wave, wait up to S real (not simulated) "
        "s until it counts no other clients' request on any backend",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/sim-fleet"))
    args = parser.parse_args(argv)
    interrupt_on_sigterm()
    kinds = args.kinds.split(",")
    try:
        limits = ({} if args.twin_limits else FLEET_LIMITS) | _limits(args.limit, kinds)
    except ValueError as error:
        parser.error(str(error))
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    items = sample(args.prompts, args.per_task)
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    interrupted = False
    more = adaptive_bench.warmup_items(args.prompts, items, args.per_task, args.warmup, 3000)
    book_size = args.per_task + 2 * args.warmup  # the simulator knows the warm-up prompts too
    with (
        tempfile.TemporaryDirectory(prefix="specgate-sim-fleet-") as tmp,
        running_fleet(
            args.gpus,
            kinds,
            args.scale,
            args.prompts,
            book_size,
            logs,
            args.profile,
            prefix_cache=not args.no_prefix_cache,
        ) as urls,
    ):
        names = {n: n.rsplit("-g", 1)[0] for n in urls}
        targets = {k: [u for n, u in urls.items() if names[n] == k] for k in kinds}
        gateways: list[Server] = []
        for name in ("static", "specgate") if args.static else ("specgate",):
            config = fleet_config(
                names,
                urls,
                groups=not args.no_compute_groups,
                limits=limits,
                policy="static" if name == "static" else "adaptive",
            )
            parse_config(config, "sim-fleet")  # fail here, not in the gateway, on a bad config
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            port = free_port()
            argv = [sys.executable, "-m", "cli", "serve", "--config", str(path)]
            gateways.append(
                Server(
                    name,
                    [*argv, "--port", str(port)],
                    ready_url=f"http://127.0.0.1:{port}/ready",
                    log_path=logs / ("gateway.log" if name == "specgate" else f"{name}.log"),
                    env={
                        "SPECGATE_STATE_FILE": str(Path(tmp) / f"{name}-state.json"),  # fresh
                        # a burst's peak is remembered for the same simulated time as on a GPU
                        "SPECGATE_PEAK_WINDOW_S": str(PEAK_WINDOW_S * args.scale),
                    },
                )
            )
            targets[name] = [f"http://127.0.0.1:{port}"]
        url = targets.pop("specgate")[0]
        router: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if args.router:
            spec = vllm_router_target(free_port(), targets["plain"], logs / "peers.log")
            ready = spec.url + spec.ready_path
            router = Server(spec.name, spec.argv, ready_url=ready, log_path=logs / "router.log")
            targets[f"{RELAY}vllm-router"] = [spec.url]
        with contextlib.ExitStack() as started_servers:
            for server in (*gateways, router):
                started_servers.enter_context(server)
            targets["specgate"] = [url]  # last: after the static gateway and the router
            warm = adaptive_bench.warm_up(
                url, MODEL, more, args.warmup, args.max_tokens, tqdm.write, list(urls.values())
            )
            tqdm.write(f"bench: warm-up done, {sum(1 for w in warm if w.error)} failed")
            try:
                measure(
                    targets, urls, items, concurrencies, args.max_tokens, args.scale, runs,
                    args.waves, args.quiet_gateways,
                )  # fmt: skip
            except KeyboardInterrupt:
                interrupted = True
    meta = {
        "config": f"simulated: {args.gpus} GPUs x {args.kinds}, {args.profile.name}, "
        f"scale {args.scale}",
        "launched": True,
        "per_task": args.per_task,
        "max_tokens": args.max_tokens,
        "max_prompt_chars": 3000,
        "scale": args.scale,
        "compute_groups": not args.no_compute_groups,
        "waves": args.waves,
        "limits": ("twin config " if args.twin_limits else "") + str(limits),
        "prefix_cache": not args.no_prefix_cache,
        "static": args.static,
        "quiet_gateways_real_s": args.quiet_gateways,
        "elapsed_s": time.monotonic() - started,
        "interrupted": interrupted,
    }
    if not runs:
        return 130 if interrupted else 1
    speedup_report.write(args.out, runs, meta)
    print((args.out / "speedup.md").read_text())
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
