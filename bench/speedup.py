"""Speculative-decoding speedup: each backend alone vs specgate, per task, on real servers.

    python -m bench.speedup --launch                     # start the local CPU stack, run, stop
    python -m bench.speedup --config FILE --gateway URL  # servers already running (e.g. GPUs)

Sends the same small sample of the shared prompt datasets (:mod:`bench.workloads`: per task
``--per-task`` prompts, near-greedy code and rag, warm chat, hot creative, seeded at c1,
``--max-tokens`` output tokens) as streamed requests to every backend of the config alone,
then through the gateway, at each ``--concurrency`` (waves of mixed tasks, each wave in a
shuffled arrival order, the same for every target).
Reports per task: output tokens/s per request (sum of tokens over sum of end-to-end times),
time to first token p50/p99, inter-token latency p50, end-to-end p50/p99; per run, each
speculative backend's acceptance rate from its ``/metrics`` counter deltas; and the gateway's
choice of backend per task. Writes ``results.json``, ``speedup.md`` and charts to ``--out``.

``--adaptive`` adds an ``adaptive`` target: a second gateway with ``routing.policy: adaptive``,
warmed up first (see :mod:`bench.adaptive_bench`; use ``--concurrency 1``).
``--extra-gateway adaptive-NAME=URL`` adds a running variant of it, warmed up alike;
``--relay NAME=URL`` a running relay in front of one backend (``bench.bare_proxy``,
vllm-router), not warmed up, as ``relay-NAME``: the reference a gateway's own cost is read
against (docs/benchmarks.md section 7, "Ninth run"). ``--quiet-gateways S`` has each
gateway's wave wait, up to S s, until that gateway counts no other clients' request on any
backend (:func:`wait_quiet`): the single backends and the other gateways load the same
servers just before it, and a gateway counts their requests as load until a scrape shows
them gone.

``--launch`` starts the config's ``local: true`` backends itself (on free ports, so a stack
already running on 8001-8004 is left alone), the gateway in a subprocess, and stops them all
at the end, error or Ctrl-C. It needs about 10 GB of free memory. Timings are reported,
never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from tqdm import tqdm

from bench import adaptive_bench, speedup_report
from bench.llm_client import run_items
from bench.procs import Server, free_port, interrupt_on_sigterm
from bench.speedup_report import RELAY, is_gateway
from bench.workloads import WAVES, Item, default_prompts_dir, sample, unseeded, waves
from contracts.config import GatewayConfig, load_config, parse_config
from contracts.vllm_metrics import parse_vllm_metrics

MIN_FREE_GIB = 10.0


def available_gib() -> float:
    """MemAvailable from /proc/meminfo, in GiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def remap_ports(path: Path) -> dict[str, Any]:
    """The config at ``path`` with every local backend moved to a free port."""
    data = yaml.safe_load(path.read_text())
    for backend in data["backends"].values():
        if backend.get("local") and backend.get("profile"):
            backend["profile"]["port"] = free_port()
            backend.pop("url", None)
    return data


@contextlib.contextmanager
def launched(config_path: Path, work: Path, logs: Path) -> Iterator[tuple[GatewayConfig, str]]:
    """Start the local backends and the gateway (their logs in ``logs``); yield (config in
    use, gateway URL)."""
    from backends.launcher import LocalStack
    from cli.launch import cache_paths, launched_keep_alive, local_backends, prepare
    from gateway.settings import Settings

    free = available_gib()
    if free < MIN_FREE_GIB:
        raise SystemExit(f"bench: only {free:.1f} GiB available, need {MIN_FREE_GIB:g}")
    data = remap_ports(config_path)
    config = parse_config(data, str(config_path))
    launched_path = work / "speedup-config.yaml"
    launched_path.write_text(yaml.safe_dump(data, sort_keys=False))
    settings = launched_keep_alive(Settings(config=launched_path), config)  # as `up` does
    python = prepare(settings)
    keep_alive_s = settings.backend_keep_alive_s
    backends = local_backends(config, cache_paths(settings), python, keep_alive_s=keep_alive_s)
    for backend in backends:  # not the cache's logs/: a `specgate up` may be writing there
        backend.log_path = logs / f"{backend.name}.log"
    stack = LocalStack(backends, timeout_s=600, log=tqdm.write)
    port = free_port()
    gateway = Server(
        "specgate",
        [
            sys.executable,
            "-m",
            "cli",
            "serve",
            "--config",
            str(launched_path),
            "--port",
            str(port),
        ],
        ready_url=f"http://127.0.0.1:{port}/ready",
        log_path=logs / "gateway.log",
        env={  # starts fresh
            "SPECGATE_STATE_FILE": str(work / "gateway-state.json"),
            "SPECGATE_BACKEND_KEEP_ALIVE_S": f"{keep_alive_s:g}",
        },
    )
    with stack, gateway:
        yield config, f"http://127.0.0.1:{port}"


def scrape(config: GatewayConfig) -> dict[str, tuple[float, float] | None]:
    """(draft tokens, accepted tokens) per backend now (None for plain or unreachable)."""
    out: dict[str, tuple[float, float] | None] = {}
    for name, backend in config.backends.items():
        try:
            text = httpx.get(backend.base_url + "/metrics", timeout=5).text
            spec = parse_vllm_metrics(text).spec
        except (httpx.HTTPError, ValueError):
            spec = None
        out[name] = None if spec is None else (spec.draft_tokens, spec.accepted_tokens)
    return out


def wait_quiet(gateway_url: str, timeout_s: float, poll_s: float = 0.05) -> float:
    """Wait until specgate at ``gateway_url`` counts no other clients' request on any
    backend (``/routes``: every ``load.other_clients`` under 0.5), at most ``timeout_s``;
    returns the seconds waited. A target whose first answer is not specgate's ``/routes``
    (a relay, an admin API turned off or behind a token) is not waited for; a failed read
    later in the wait is read again until ``timeout_s``. Each read is bounded by the time
    left (at least 0.1 s).

    The bench's single backends and its other gateways load the same servers just before
    a gateway's wave, and a gateway counts such requests as another client's until a scrape
    shows them gone (``gateway.upstream.state.BackendState.foreign_load``: what two scrapes
    in a row saw counts as steady traffic). On the simulator (docs/benchmarks.md section
    7b, session 36) two of four waves of 16 reached the static gateway with 2 and 7 of them
    still counted, past EAGLE-3's ``max_batch_for_speculation`` of 16, and went to plain.
    Waiting measures each gateway as it is deployed, the servers' only client, as each
    single backend is measured."""
    url = gateway_url.rstrip("/") + "/routes"
    start = time.monotonic()
    first = True
    with httpx.Client() as client:
        while True:
            left = timeout_s - (time.monotonic() - start)
            busy = _others(client, url, max(left, 0.1))
            waited = time.monotonic() - start
            if busy is None and first:
                return waited  # not specgate's /routes: nothing to wait for
            first = False
            if (busy is not None and busy < 0.5) or waited >= timeout_s:
                return waited
            time.sleep(poll_s)


def waits_for_quiet(target: str) -> bool:
    """Whether ``--quiet-gateways`` waits before ``target``'s waves: a gateway
    (:func:`bench.speedup_report.is_gateway`), not a relay (nothing to ask)."""
    return is_gateway(target) and not target.startswith(RELAY)


def _others(client: httpx.Client, url: str, timeout_s: float) -> float | None:
    """The most other clients' requests specgate's ``/routes`` at ``url`` counts on one
    backend; None when the answer is not that (an error, another server)."""
    try:
        answer = client.get(url, timeout=timeout_s)
        backends = answer.json()["backends"] if answer.status_code == 200 else None
        if not isinstance(backends, list):
            return None
        return max((float(b["load"]["other_clients"] or 0.0) for b in backends), default=0.0)
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def acceptance(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per speculative backend: drafted and accepted token deltas and their ratio."""
    out = {}
    for name, end in after.items():
        start = before.get(name)
        if end is None or start is None:
            continue
        drafted, accepted = end[0] - start[0], end[1] - start[1]
        rate = accepted / drafted if drafted else float("nan")
        out[name] = {"draft_tokens": drafted, "accepted_tokens": accepted, "rate": rate}
    return out


def measure(
    config: GatewayConfig,
    gateway_url: str,
    items: Sequence[Item],
    concurrencies: Sequence[int],
    max_tokens: int,
    backends: Sequence[str],
    extra: Sequence[tuple[str, str]] = (),
    settle_s: float = 0.5,
    runs: list[dict[str, Any]] | None = None,
    order_seed: int = 0,
    dealing: str = "mixed",
    quiet_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Every (concurrency, target) run: outcomes, wall time, acceptance deltas; the items
    dealt into waves by :func:`~bench.workloads.waves` (``dealing``: mixed or per-task).
    ``quiet_s`` > 0: before each wave to a gateway (specgate, ``adaptive*``; not a relay),
    :func:`wait_quiet` for it, at most that long (the seconds waited are each run's
    ``quiet_wait_s``, outside its wall time).

    Targets are interleaved: the items go in waves of ``concurrency`` requests, each in
    :func:`~bench.workloads.arrival_order` (the same for every target), and every target
    serves each wave in turn, in a fresh random order per wave, after ``settle_s`` of
    quiet: a CPU server that just worked keeps its threads spinning for a while and slows the
    next one (measured here: up to +0.8 s time to first token), so a fixed order would favour
    some targets for some tasks. The orders come from ``random.Random(order_seed)``: the same
    seed gives every run the same orders, so repeats meant to average a position out need
    seeds of their own (docs/benchmarks.md section 7, "Tenth run": with one seed for all
    repeats, the twin's c=64 wave of 48 ran the static gateway right after plain every time).
    """
    rng = random.Random(order_seed)
    model = next(iter(config.backends.values())).served_model
    targets = [(n, config.backends[n].base_url) for n in backends] + [("specgate", gateway_url)]
    targets += extra  # more gateways (name, URL), e.g. the adaptive one
    for _name, url in targets:  # warm-up: first requests pay one-off costs
        run_items(url, model, items[:2], concurrency=2, max_tokens=8)
    runs = [] if runs is None else runs  # filled per concurrency: kept if interrupted
    total = len(concurrencies) * len(targets) * len(items)
    with tqdm(total=total, desc="speedup", unit="req") as bar:
        for concurrency in concurrencies:
            acc = {name: _Run(name, concurrency) for name, _ in targets}
            sent = items if concurrency == 1 else unseeded(items)
            for wave in waves(sent, concurrency, dealing):
                for name, url in rng.sample(targets, len(targets)):
                    bar.set_postfix_str(f"c{concurrency} {name}")
                    time.sleep(settle_s)
                    if quiet_s > 0 and waits_for_quiet(name):
                        acc[name].quiet_wait_s += wait_quiet(url, quiet_s)
                    before = scrape(config)
                    outcomes, wall = run_items(
                        url,
                        model,
                        wave,
                        concurrency=concurrency,
                        max_tokens=max_tokens,
                        on_done=lambda _: bar.update(),
                    )
                    acc[name].add(outcomes, wall, acceptance(before, scrape(config)))
            for run in acc.values():
                runs.append(run.to_json())
                if run.failed:
                    tqdm.write(f"bench: {run.name} c{concurrency}: {run.failed} failed")
    return runs


class _Run:
    """Accumulates one (target, concurrency) over the waves."""

    def __init__(self, name: str, concurrency: int) -> None:
        self.name, self.concurrency = name, concurrency
        self.outcomes: list[dict[str, Any]] = []
        self.wall_s = 0.0
        self.quiet_wait_s = 0.0  # waited for the gateway's quiet before its waves (measure)
        self.acceptance: dict[str, dict[str, float]] = {}
        self.failed = 0

    def add(self, outcomes: Sequence[Any], wall: float, acc: dict[str, dict[str, float]]) -> None:
        self.outcomes += [o.to_json() for o in outcomes]
        self.failed += sum(1 for o in outcomes if o.error)
        self.wall_s += wall
        for backend, delta in acc.items():
            total = self.acceptance.setdefault(backend, {"draft_tokens": 0, "accepted_tokens": 0})
            total["draft_tokens"] += delta["draft_tokens"]
            total["accepted_tokens"] += delta["accepted_tokens"]

    def to_json(self) -> dict[str, Any]:
        for total in self.acceptance.values():
            drafted = total["draft_tokens"]
            total["rate"] = total["accepted_tokens"] / drafted if drafted else float("nan")
        return {
            "target": self.name,
            "concurrency": self.concurrency,
            "wall_s": self.wall_s,
            "quiet_wait_s": self.quiet_wait_s,
            "acceptance": self.acceptance,
            "outcomes": self.outcomes,
        }


def _named_url(spec: str) -> tuple[str, str]:
    """``NAME=URL`` -> (name, url); raises argparse.ArgumentTypeError when the URL is empty or
    the name does not start with ``adaptive-`` (the report takes such names for gateways, not
    single backends: :func:`bench.speedup_report.is_gateway`)."""
    name, _, url = spec.partition("=")
    if not url or not name.startswith("adaptive-"):
        raise argparse.ArgumentTypeError(f"expected adaptive-NAME=URL, got {spec!r}")
    return name, url


def _relay_url(spec: str) -> tuple[str, str]:
    """``NAME=URL`` -> (``relay-NAME``, url): a ``--relay`` target, named so that the report
    takes it for neither a single backend nor one of specgate's gateways; raises
    argparse.ArgumentTypeError when the name or the URL is empty."""
    name, _, url = spec.partition("=")
    if not name or not url:
        raise argparse.ArgumentTypeError(f"expected NAME=URL, got {spec!r}")
    return f"{RELAY}{name}", url


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("config/local.yaml"))
    parser.add_argument("--gateway", default="http://127.0.0.1:8000", help="without --launch")
    parser.add_argument("--launch", action="store_true", help="start and stop the local stack")
    parser.add_argument("--backends", help="comma-separated backend names (default: all)")
    parser.add_argument("--prompts", type=Path, default=default_prompts_dir())
    parser.add_argument("--per-task", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-chars", type=int, default=3000)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--settle", type=float, default=0.5, help="seconds between targets")
    parser.add_argument(
        "--quiet-gateways",
        type=float,
        default=0.0,
        metavar="S",
        help="before a gateway's wave, wait up to S s until it counts no other clients' "
        "request on any backend (0: no wait)",
    )
    parser.add_argument(
        "--waves",
        choices=WAVES,
        default="mixed",
        help="mixed: every task in each wave; per-task: one task a wave (give --per-task at "
        "least the largest concurrency), so each (task, c) cell's oracle is reachable",
    )
    parser.add_argument(
        "--order-seed",
        type=int,
        default=0,
        help="seeds the targets' order in each wave; give each repeat its own",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/speedup"))
    parser.add_argument("--adaptive", action="store_true", help="add the adaptive gateway")
    parser.add_argument("--adaptive-gateway", help="its URL when already running")
    parser.add_argument("--warmup", type=int, default=30, help="adaptive warm-up per task")
    parser.add_argument(
        "--extra-gateway",
        action="append",
        default=[],
        type=_named_url,
        metavar="NAME=URL",
        help="another running gateway measured beside them (e.g. a variant of the adaptive "
        "one, NAME adaptive-...), warmed up as the adaptive one is; repeatable",
    )
    parser.add_argument(
        "--relay",
        action="append",
        default=[],
        type=_relay_url,
        metavar="NAME=URL",
        help="a running relay in front of one backend (bench.bare_proxy, vllm-router), "
        "measured beside them as relay-NAME, not warmed up: what relaying alone costs; "
        "repeatable",
    )
    parser.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="backends without prefix caching: --launch starts them so; without --launch, "
        "say that the running ones were (the report records it)",
    )
    args = parser.parse_args(argv)
    interrupt_on_sigterm()
    items = sample(args.prompts, args.per_task, args.max_prompt_chars)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="specgate-speedup-") as tmp:
        config_path = args.config
        if args.no_prefix_cache:  # each target of a wave then pays the same prefill
            config_path = adaptive_bench.without_prefix_cache(args.config, Path(tmp))
        if args.launch:
            context: Any = launched(config_path, Path(tmp), args.out / "logs")
        else:
            context = contextlib.nullcontext((load_config(args.config), args.gateway))
        with context as (config, gateway_url), adaptive_bench.context(args, Path(tmp)) as url:
            names = args.backends.split(",") if args.backends else list(config.backends)
            warm, extra = [], []
            if url is not None:
                more = adaptive_bench.warmup_items(
                    args.prompts, items, args.per_task, args.warmup, args.max_prompt_chars
                )
                model = next(iter(config.backends.values())).served_model
                backend_urls = [b.base_url for b in config.backends.values()]
                warm = adaptive_bench.warm_up(
                    url, model, more, args.warmup, args.max_tokens, tqdm.write, backend_urls
                )
                extra = [(adaptive_bench.TARGET, url)]
            for name, extra_url in args.extra_gateway:
                if url is not None:
                    adaptive_bench.warm_up(
                        extra_url, model, more, args.warmup, args.max_tokens, tqdm.write,
                        backend_urls,
                    )  # fmt: skip
                extra.append((name, extra_url))
            extra += args.relay
            try:
                measure(
                    config,
                    gateway_url,
                    items,
                    concurrencies,
                    args.max_tokens,
                    names,
                    extra,
                    settle_s=args.settle,
                    runs=runs,
                    order_seed=args.order_seed,
                    dealing=args.waves,
                    quiet_s=args.quiet_gateways,
                )
            except KeyboardInterrupt:
                interrupted = True
                tqdm.write("bench: interrupted; servers stopped; reporting the runs done")
    meta = {
        "config": str(args.config),
        "launched": args.launch,
        "per_task": args.per_task,
        "max_tokens": args.max_tokens,
        "max_prompt_chars": args.max_prompt_chars,
        "settle_s": args.settle,
        "quiet_gateways_s": args.quiet_gateways,
        "order_seed": args.order_seed,
        "waves": args.waves,
        "prefix_cache": not args.no_prefix_cache,
        "items": [
            {
                "task": i.task,
                "id": i.id,
                "path": i.path,
                "prompt_chars": i.prompt_chars,
                "temperature": i.body["temperature"],
            }
            for i in items
        ],
        "elapsed_s": time.monotonic() - started,
        "interrupted": interrupted,
    }
    if not runs:
        return 130 if interrupted else 1
    speedup_report.write(args.out, runs, meta)
    if extra:
        adaptive_bench.report(args.out, runs, warm)
    print((args.out / "speedup.md").read_text())
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
