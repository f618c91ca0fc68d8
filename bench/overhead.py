"""Gateway overhead: specgate vs vllm-router vs LiteLLM vs direct, on a fast fake upstream.

    python -m bench.overhead [--duration 4] [--rounds 3] [--out bench/out/overhead]
                             [--targets direct,specgate,vllm-router,litellm,bare-proxy]
                             [--specgate-variant LABEL:SPECGATE_X=V[,SPECGATE_Y=W]]
                             [--specgate-variant LABEL:tree=/path/to/other/checkout]

A fake vLLM upstream (:mod:`bench.fake_upstream`: no token delay, 64-token answers) listens
on three ports; every gateway fronts all three. Scenarios: non-streamed chat completions at
concurrency 1, 32 and 64 (``wrk``), streamed 64-chunk completions at concurrency 1 and 32
(aiohttp client, time to first chunk per request). Each round runs every scenario against
every target in turn (order rotated per round), so slow drifts of the machine hit all
targets alike; figures are medians over rounds. A gateway's CPU time per request is the
user+system time of its whole process tree (from ``/proc``) over the run, divided by the
requests served. With 2+ CPUs, gateways are pinned to the last CPU and the fake upstream
and load generators to the others, so a gateway never competes with the load for a core.

Writes ``results.json`` (raw per-run and aggregated figures, machine, versions),
``overhead.md`` (the table) and PNG charts to ``--out``. Timings are reported, never
asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench import overhead_report
from bench.load import LoadResult, run_streams, run_wrk, wrk_path
from bench.procs import (
    Server,
    cpu_seconds,
    free_port,
    interrupt_on_sigterm,
    load_average,
    machine,
    mapped_libraries,
)
from bench.targets import (
    PATH,
    TargetSpec,
    bare_proxy_target,
    litellm_target,
    request_body,
    specgate_target,
    vllm_router_target,
)

#: Shared objects whose presence tells which event loop, HTTP parser or client a server uses.
LIBRARIES = ["uvloop", "httptools", "granian", "aiohttp"]


@dataclass(frozen=True)
class Scenario:
    """One load shape: streamed or not, at a concurrency."""

    stream: bool
    concurrency: int

    @property
    def name(self) -> str:
        """E.g. ``json c32`` or ``stream c1``."""
        return f"{'stream' if self.stream else 'json'} c{self.concurrency}"


SCENARIOS = (Scenario(False, 1), Scenario(False, 32), Scenario(False, 64))
SCENARIOS += (Scenario(True, 1), Scenario(True, 32))


def run_once(target: TargetSpec, scenario: Scenario, pid: int, duration_s: float) -> dict[str, Any]:
    """One load run; returns the load figures plus CPU ms per request of process ``pid``."""
    url = target.url + PATH
    body = request_body(scenario.stream)
    before = cpu_seconds(pid)
    runner = run_streams if scenario.stream else run_wrk
    result: LoadResult = runner(url, body, concurrency=scenario.concurrency, duration_s=duration_s)
    used = cpu_seconds(pid) - before
    row = result.to_json()
    row["cpu_ms_per_request"] = used * 1000 / result.requests if result.requests else None
    row |= {"target": target.name, "scenario": scenario.name}
    return row


Variant = tuple[dict[str, str], list[str]]  # (SPECGATE_* env, bench.variants flags)


def parse_variants(values: Sequence[str]) -> dict[str, Variant]:
    """``LABEL:ITEM,ITEM`` -> ``{"specgate[LABEL]": (env, flags)}``. An item
    ``SPECGATE_X=V`` is an environment setting; ``tree=PATH`` runs the code of another
    checkout (e.g. ``git archive BASE | tar -x -C PATH``: an A/B of two commits in one run);
    ``server=granian`` becomes the :mod:`bench.variants` flag ``--server granian``."""
    out: dict[str, Variant] = {}
    for value in values:
        label, _, items = value.partition(":")
        env: dict[str, str] = {}
        flags: list[str] = []
        for item in filter(None, items.split(",")):
            key, eq, val = item.partition("=")
            if key.startswith("SPECGATE_"):
                env[key] = val
            elif key == "tree":  # that checkout's packages first, not the working directory's
                env |= {"PYTHONPATH": val, "PYTHONSAFEPATH": "1"}
            else:
                flags += [f"--{key}", val] if eq else [f"--{key}"]
        out[f"specgate[{label}]"] = (env, flags)
    return out


def build_targets(
    names: Sequence[str],
    variants: dict[str, Variant],
    upstreams: list[str],
    work: Path,
    logs: Path,
) -> list[TargetSpec]:
    """The target specs to run, peers installed on first use (pip output in ``logs``)."""
    specs: list[TargetSpec] = []
    for name in names:
        port = free_port()
        if name == "direct":
            specs.append(TargetSpec("direct", int(upstreams[0].rsplit(":", 1)[1])))
        elif name == "specgate":
            specs.append(specgate_target(port, upstreams, work))
        elif name == "bare-proxy":
            specs.append(bare_proxy_target(port, upstreams))
        elif name == "vllm-router":
            specs.append(vllm_router_target(port, upstreams, logs / "install-vllm-router.log"))
        elif name == "litellm":
            specs.append(litellm_target(port, upstreams, work, logs / "install-litellm.log"))
        else:
            raise SystemExit(f"unknown target {name!r}")
    for label, (env, flags) in variants.items():
        spec = specgate_target(free_port(), upstreams, work, env, flags)
        spec.name = label
        specs.append(spec)
    return specs


def cpu_sets(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """(gateway CPUs, load CPUs): the last CPU for gateways, the rest for load."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None, None
    return {cpus[-1]}, set(cpus[:-1])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--targets", default="direct,specgate,vllm-router,litellm")
    parser.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    parser.add_argument("--specgate-variant", action="append", default=[])
    parser.add_argument("--out", type=Path, default=Path("bench/out/overhead"))
    parser.add_argument("--no-pin", action="store_true", help="do not pin CPUs")
    args = parser.parse_args(argv)
    interrupt_on_sigterm()
    wrk_path()
    load_before = load_average()
    if load_before > (os.cpu_count() or 1):
        print(
            f"bench: load average {load_before:.1f} > cores: other work shares the CPUs, "
            "expect noisy figures",
            flush=True,
        )
    scenarios = [s for s in SCENARIOS if s.name in args.scenarios.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    gateway_cpus, load_cpus = cpu_sets(not args.no_pin)
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)
    with tempfile.TemporaryDirectory(prefix="specgate-bench-") as tmp:
        work = Path(tmp)
        ports = [free_port() for _ in range(3)]
        upstreams = [f"http://127.0.0.1:{p}" for p in ports]
        fake_argv = [sys.executable, "-m", "bench.fake_upstream"]
        fake_argv += [arg for p in ports for arg in ("--port", str(p))]
        specs = build_targets(
            args.targets.split(","),
            parse_variants(args.specgate_variant),
            upstreams,
            work,
            args.out / "logs",
        )
        fake = Server(
            "fake",
            fake_argv,
            ready_url=upstreams[0] + "/health",
            log_path=args.out / "logs" / "fake.log",
            cpus=load_cpus,
        )
        with fake:
            servers = start_targets(specs, fake, gateway_cpus, args.out / "logs")
            libs = {name: mapped_libraries(s.pid, LIBRARIES) for name, s in servers.items()}
            try:
                rows = measure(specs, servers, scenarios, args.rounds, args.duration)
            finally:
                for server in servers.values():
                    server.stop()
    meta = {
        "machine": machine(),
        "duration_s": args.duration,
        "rounds": args.rounds,
        "pinned": gateway_cpus is not None,
        "request_body": request_body(False).decode(),
        "versions": {s.name: s.version for s in specs if s.version},
        "libraries": libs,
        "load_average": {"start": load_before, "end": load_average()},
    }
    overhead_report.write(args.out, rows, meta)
    print((args.out / "overhead.md").read_text())
    return 0


def start_targets(
    specs: Sequence[TargetSpec], fake: Server, cpus: set[int] | None, logs: Path
) -> dict[str, Server]:
    """Start every target (the fake stands for ``direct``), stopping those started if one
    fails."""
    servers: dict[str, Server] = {}
    for spec in specs:
        if spec.name == "direct":
            server = fake
        else:
            print(f"bench: starting {spec.name} on :{spec.port}", flush=True)
            server = Server(
                spec.name,
                spec.argv,
                ready_url=spec.url + spec.ready_path,
                log_path=logs / f"{spec.name}.log",
                env=spec.env,
                cpus=cpus,
            )
            try:
                server.start()
            except RuntimeError:
                for started in servers.values():
                    if started is not fake:
                        started.stop()
                raise
        servers[spec.name] = server
    return servers


def measure(
    specs: Sequence[TargetSpec],
    servers: dict[str, Server],
    scenarios: Sequence[Scenario],
    rounds: int,
    duration_s: float,
) -> list[dict[str, Any]]:
    """Warm up, then ``rounds`` x scenarios x targets runs (target order rotated per round)."""
    for spec in tqdm(specs, desc="warm-up", unit="target"):
        for scenario in scenarios:
            run_once(spec, scenario, servers[spec.name].pid, min(1.0, duration_s))
    rows: list[dict[str, Any]] = []
    total = rounds * len(scenarios) * len(specs)
    with tqdm(total=total, desc="overhead", unit="run") as bar:
        for r in range(rounds):
            for scenario in scenarios:
                order = list(specs[r % len(specs) :]) + list(specs[: r % len(specs)])
                for spec in order:
                    bar.set_postfix_str(f"{scenario.name} {spec.name}")
                    row = run_once(spec, scenario, servers[spec.name].pid, duration_s)
                    row["round"] = r
                    rows.append(row)
                    bar.update()
    return rows


if __name__ == "__main__":
    sys.exit(main())
