"""The ``specgate`` command line: serve, up, models prepare, config check, backends, drafts."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from cli.backends import add_backends_commands, run_backends_command
from cli.drafts import add_drafts_commands, run_drafts_command
from cli.serve import basic_logging, run_gateway
from cli.tune import add_tune_command, run_tune
from contracts.config import ConfigError, GatewayConfig, attach_engine_guards, load_config
from gateway.auth import InsecureSettings, build_auth
from gateway.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every ``specgate`` subcommand."""
    parser = argparse.ArgumentParser(prog="specgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add_server_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, help="gateway config YAML (SPECGATE_CONFIG)")
        p.add_argument("--host", help="listen address (SPECGATE_HOST, default 127.0.0.1)")
        p.add_argument("--port", type=int, help="listen port (SPECGATE_PORT, default 8000)")

    serve = sub.add_parser("serve", help="run the gateway against running backends")
    add_server_args(serve)
    up = sub.add_parser("up", help="prepare models, launch local backends, run the gateway")
    add_server_args(up)
    up.add_argument(
        "--startup-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for each backend to become healthy",
    )

    models = sub.add_parser("models", help="local model folders")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    models_sub.add_parser("prepare", help="build the local target and draft model folders")

    explain = sub.add_parser(
        "explain", help="print the routing decision for a request body read on stdin (offline)"
    )
    explain.add_argument("--config", type=Path, required=True)
    explain.add_argument("--task-type", help="as the X-Task-Type header would")
    explain.add_argument(
        "--speculation", help="off, on or auto, as the X-Specgate-Speculation header would"
    )

    add_backends_commands(sub)
    add_drafts_commands(sub)
    add_tune_command(sub)

    config = sub.add_parser("config", help="config files")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config and print what it defines")
    given = check.add_mutually_exclusive_group(required=True)
    given.add_argument("file", type=Path, nargs="?", help="the config YAML")
    given.add_argument(
        "--config", dest="config_file", metavar="FILE", type=Path, help="the same, as a flag"
    )
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from ``SPECGATE_*`` variables, overridden by the flags given (those a command
    has). Raises ``pydantic.ValidationError`` for a value that is not valid
    (:func:`settings_problem` words it)."""
    names = ("config", "host", "port")
    overrides = {k: getattr(args, k) for k in names if getattr(args, k, None)}
    return Settings(**overrides)


def settings_problem(exc: ValidationError) -> str:
    """One line per invalid setting, named as its variable: ``SPECGATE_X='abc': Input should
    be a valid number, ...``."""
    lines = [
        f"{Settings.model_config['env_prefix']}{'.'.join(map(str, e['loc'])).upper()}"
        f"={e['input']!r}: {e['msg']}"
        for e in exc.errors()
    ]
    return "specgate: invalid settings:\n  " + "\n  ".join(lines)


def describe(config: GatewayConfig) -> str:
    """A human summary of a config: backends (with their known engine bugs), pools, rules."""
    lines = ["backends:"]
    for name, b in config.backends.items():
        spec = b.spec
        detail = (
            spec.method
            if not spec.speculative
            else (
                f"{spec.method} k={spec.num_speculative_tokens}"
                + (f" draft={spec.model}" if spec.model else "")
            )
        )
        where = "local" if b.local else "remote"
        lines.append(f"  {name:<12} {b.base_url:<28} model={b.served_model} {detail} ({where})")
        if b.guards:
            lines.append(f"  {'':<12} known engine bugs avoided: {', '.join(b.guards)}")
    lines.append("pools:")
    lines += [f"  {name:<12} {', '.join(members)}" for name, members in config.pools.items()]
    lines.append("rules (first match wins):")
    for i, r in enumerate(config.rules, start=1):
        match = r.match.model_dump(exclude_none=True) or "any"
        fallbacks = f" then {', '.join(r.fallbacks)}" if r.fallbacks else ""
        seeded = f" (seeded sampling: {r.seeded_pool})" if r.seeded_pool else ""
        lines.append(f"  {i}. {r.name}: {match} -> {r.pool}{fallbacks}{seeded}")
    lines.append(f"  otherwise -> {config.defaults.pool}")
    return "\n".join(lines)


def cmd_config_check(path: Path) -> int:
    """Validate ``path``; print the summary (exit 0) or every error (exit 1)."""
    try:  # with the known faults of the local engine, as the gateway will run it
        config = attach_engine_guards(load_config(path), Settings().local_engine())
    except ConfigError as exc:
        count = len(exc.issues)
        problems = f"{count} problem{'s' if count != 1 else ''}"
        print(f"{exc.source}: invalid config ({problems})", file=sys.stderr)
        for issue in exc.issues:
            print(f"{exc.source}: {issue.path or '<root>'}: {issue.message}", file=sys.stderr)
        return 1
    print(f"{path}: ok")
    print(describe(config))
    return 0


def cmd_explain(config_path: Path, task_type: str | None, speculation: str | None = None) -> int:
    """Explain the decision for the JSON body on stdin, all backends assumed healthy and idle,
    with the task classifier a gateway with these settings would load (its second stage when
    prepared); prints the decision JSON (exit 0) or the OpenAI error envelope (exit 1)."""
    from gateway.classify.embedding_stage import load_stages
    from gateway.errors import GatewayError
    from gateway.service import Gateway
    from gateway.settings import Settings

    try:
        stages = load_stages(Settings().classifier_embedding_dir())
        config = attach_engine_guards(load_config(config_path), Settings().local_engine())
        gateway = Gateway(config, classifier=stages)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        body = json.loads(sys.stdin.read())
        headers = {"x-task-type": task_type, "x-specgate-speculation": speculation}
        result = gateway.explain(body, {k: v for k, v in headers.items() if v is not None})
    except ValueError:
        print(
            json.dumps(
                {
                    "error": {
                        "message": "stdin is not valid JSON",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                }
            )
        )
        return 1
    except GatewayError as exc:
        print(json.dumps(exc.envelope()))
        return 1
    print(json.dumps(result, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specgate`` console script; returns the exit code. An invalid
    ``SPECGATE_*`` variable, in whichever command reads the settings, ends it with
    :func:`settings_problem`'s lines (exit 1) instead of a traceback."""
    args = build_parser().parse_args(argv)
    basic_logging()
    try:
        return run_command(args)
    except ValidationError as exc:
        if exc.title != Settings.__name__:
            raise
        print(settings_problem(exc), file=sys.stderr)
        return 1


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; returns its exit code."""
    if args.command == "config":
        return cmd_config_check(args.file or args.config_file)
    if args.command == "explain":
        return cmd_explain(args.config, args.task_type, args.speculation)
    if args.command == "tune":
        return run_tune(args)
    if args.command == "backends":
        return run_backends_command(args)
    if args.command == "drafts":
        return run_drafts_command(args)
    if args.command == "models":
        from backends.vllm_env import SetupError
        from cli.launch import prepare

        try:
            prepare(settings_from_args(args))
        except SetupError as exc:
            print(f"specgate: models prepare failed: {exc}", file=sys.stderr)
            return 1
        return 0
    settings = settings_from_args(args)
    try:
        config = settings.load_config()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        build_auth(settings)
    except (InsecureSettings, OSError) as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return 1
    if args.command == "serve":
        run_gateway(settings, config)
        return 0
    from cli.launch import up

    return up(settings, config, startup_timeout_s=args.startup_timeout)


if __name__ == "__main__":
    sys.exit(main())
