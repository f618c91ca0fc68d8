"""The generated deployments run what they describe, locked.

The gateway service of docker/compose.gpu.yaml and docker/k8s/specgate.yaml (and of their
``--admin off`` variants) runs as its runtime would start it (tests/fakes/deployment.py): its
command, its environment with the secrets resolved from test values, its config mounted, in a
private network namespace where the backend service names resolve to fake vLLM servers
(tests/fakes/sandbox.py). It must pass its own health check, answer a routed request with the
client key, and refuse ``/routes`` without the admin token. Without its secrets it must not
start, and the message names what is missing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.compose import build_compose
from backends.k8s import build_manifests
from backends.stack import (
    ADMIN_TOKEN_VAR,
    API_KEYS_VAR,
    AdminMode,
    gateway_secret_vars,
    service_name,
)
from contracts.config import load_config
from tests.fakes.deployment import (
    BackendService,
    ContainerRun,
    DeploymentError,
    compose_backends,
    compose_gateway,
    interpolate,
    k8s_backends,
    k8s_gateway,
)
from tests.fakes.sandbox import Observed, Scenario, run_scenario, sandbox_problem
from tests.fakes.vllm_python import VLLM_PYTHON, run_in_vllm

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "config/production.example.yaml"
COMPOSE = ROOT / "docker" / "compose.gpu.yaml"
MANIFESTS = ROOT / "docker" / "k8s" / "specgate.yaml"
CLIENT_KEYS = "client-key-a,client-key-b"
ADMIN_TOKEN = "admin-token-for-tests"
#: what an operator puts in docker/specgate.env, and in the specgate-auth Secret
VARIABLES = {API_KEYS_VAR: CLIENT_KEYS, ADMIN_TOKEN_VAR: ADMIN_TOKEN}
SECRETS = {"specgate-auth": {"api-keys": CLIENT_KEYS, "admin-token": ADMIN_TOKEN}}
MODEL = "llama-3.1-8b-instruct"
#: the backends config/production.example.yaml routes code at temperature 0 to
CODE_POOL = {"vllm-eagle3", "vllm-draft"}


@pytest.fixture(scope="module")
def sandbox() -> None:
    """Skip where no network namespace can be made (an unprivileged developer machine without
    user namespaces); in CI (``CI=true``, root) that is a failure, not a skip."""
    problem = sandbox_problem()
    if problem is not None:
        message = f"no private network namespace here: {problem}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def compose_text(admin: AdminMode) -> str:
    if admin == "token":
        return COMPOSE.read_text()  # the committed file itself
    return build_compose(load_config(ROOT / SOURCE), SOURCE, admin="off")


def manifests_text(admin: AdminMode) -> str:
    if admin == "token":
        return MANIFESTS.read_text()
    return build_manifests(load_config(ROOT / SOURCE), SOURCE, admin="off")


def container_env(run: ContainerRun, root: Path) -> dict[str, str]:
    """The container's environment plus what the image provides: its PATH (here the venv
    with the gateway installed) and Python's unbuffered output; nothing from this process."""
    image = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(root),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return image | run.env


def scenario(run: ContainerRun, backends: list[BackendService], root: Path, **kw: Any) -> Scenario:
    run.write_files()
    return Scenario(
        argv=run.argv,
        env=container_env(run, root),
        cwd=str(root),
        backends=[
            {"host": b.host, "port": b.port, "model": b.model, "argv": b.argv} for b in backends
        ],
        health_argv=run.health_argv,
        probe_paths=run.probe_paths,
        port=run.port,
        probe_port=run.probe_port,
        model=MODEL,
        client_key=CLIENT_KEYS.split(",")[1],
        **{"listen_host": "127.0.0.1"} | kw,
    )


def assert_serves_and_is_locked(seen: Observed, admin: AdminMode) -> None:
    assert seen.preflight == 0  # the container's own env (0.0.0.0) is accepted
    assert seen.healthy, f"health {seen.health} probes {seen.probes}\n{seen.log}"
    assert seen.routed == 200, seen.log
    assert f"vllm-{seen.routed_backend}" in CODE_POOL
    assert seen.hits[f"vllm-{seen.routed_backend}"] == 1  # reached through its service name
    assert seen.no_key == 401
    if admin == "token":
        assert seen.routes_no_token == 401
        assert seen.routes_with_token == 200
    else:
        # admin endpoints off: /routes is no admin path any more, and like every other
        # path it first asks for a client key (401), then is unknown (404)
        assert seen.routes_no_token == 401
    if admin == "token":  # the replicas' shared state: the generated Redis, reached by name
        assert seen.state is not None and seen.state["backend"] == "redis", seen.log
        assert seen.state["up"] is True, seen.state
    # SIGTERM: a clean shutdown (uvicorn re-raises the signal once it has shut down)
    assert seen.exit_code in (0, -15) and "Application shutdown complete" in seen.log


@pytest.mark.parametrize("admin", ["token", "off"])
def test_compose_gateway_starts_serves_and_is_locked(
    sandbox: None, admin: AdminMode, tmp_path: Path
) -> None:
    text = compose_text(admin)
    run = compose_gateway(text, VARIABLES, tmp_path / "root")
    assert run.env["SPECGATE_HOST"] == "0.0.0.0" and run.health_argv
    token = ADMIN_TOKEN if admin == "token" else None
    seen = run_scenario(
        scenario(run, compose_backends(text), tmp_path / "root", admin_token=token), tmp_path
    )
    assert seen.health == 0
    assert_serves_and_is_locked(seen, admin)


@pytest.mark.parametrize("admin", ["token", "off"])
def test_k8s_gateway_starts_serves_and_is_locked(
    sandbox: None, admin: AdminMode, tmp_path: Path
) -> None:
    text = manifests_text(admin)
    run = k8s_gateway(text, SECRETS, tmp_path / "root")
    assert run.env["SPECGATE_HOST"] == "0.0.0.0" and set(run.probe_paths) == {"/ready", "/health"}
    token = ADMIN_TOKEN if admin == "token" else None
    seen = run_scenario(
        scenario(run, k8s_backends(text), tmp_path / "root", admin_token=token), tmp_path
    )
    assert seen.probes == {"/ready": 200, "/health": 200}
    assert_serves_and_is_locked(seen, admin)


@pytest.mark.parametrize("admin", ["token", "off"])
@pytest.mark.parametrize("missing", [API_KEYS_VAR, ADMIN_TOKEN_VAR])
@pytest.mark.parametrize("value", [None, ""])
def test_compose_refuses_to_start_without_its_secrets(
    admin: AdminMode, missing: str, value: str | None, tmp_path: Path
) -> None:
    variables = {k: v for k, v in VARIABLES.items() if k != missing}
    if value is not None:
        variables[missing] = value
    text = compose_text(admin)
    if missing not in gateway_secret_vars(admin):
        assert missing not in text  # admin off: no token asked for, none passed
        compose_gateway(text, variables, tmp_path)
        return
    with pytest.raises(DeploymentError, match=f"required variable {missing} is missing a value"):
        compose_gateway(text, variables, tmp_path)


def test_compose_interpolation_as_compose_does() -> None:
    data = {"a": "${X:-d} ${Y-e} $$x ${Z:+alt}", "b": ["${X}"]}
    assert interpolate(data, {"Y": "", "Z": "1"}) == {"a": "d  $x alt", "b": [""]}
    with pytest.raises(DeploymentError, match="required variable X is missing a value: why"):
        interpolate("${X?why}", {})


def test_k8s_gateway_without_its_secret_does_not_start(tmp_path: Path) -> None:
    text = manifests_text("token")
    with pytest.raises(DeploymentError, match='secret "specgate-auth" not found'):
        k8s_gateway(text, {}, tmp_path)
    only_keys = {"specgate-auth": {"api-keys": CLIENT_KEYS}}
    with pytest.raises(DeploymentError, match="key admin-token"):
        k8s_gateway(text, only_keys, tmp_path)
    k8s_gateway(manifests_text("off"), only_keys, tmp_path)  # off: the token is not asked for


def test_k8s_gateway_with_an_empty_token_refuses_naming_the_variable(
    sandbox: None, tmp_path: Path
) -> None:
    """The Secret exists with an empty admin-token: the pod starts, the gateway (listening on
    0.0.0.0 as the manifest says) refuses before it binds, naming the variable."""
    secrets = {"specgate-auth": {"api-keys": CLIENT_KEYS, "admin-token": ""}}
    run = k8s_gateway(manifests_text("token"), secrets, tmp_path / "root")
    text = manifests_text("token")
    seen = run_scenario(
        scenario(run, k8s_backends(text), tmp_path / "root", expect_start=False, listen_host=None),
        tmp_path,
    )
    assert seen.preflight == 1 and seen.exit_code == 1, seen.log
    assert "refusing to listen on 0.0.0.0" in seen.log and ADMIN_TOKEN_VAR in seen.log


# -- the backends: every vLLM command parses with vLLM's own `vllm serve` parser -------------

#: `vllm serve` as vLLM's CLI builds it (vllm/entrypoints/cli/main.py), parse and validate only
PARSE_SERVE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
out = []
for argv in json.loads(sys.argv[1]):
    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    try:
        args = parser.parse_args(argv)
        command.validate(args)
    except SystemExit as exc:
        out.append({"exit": exc.code})
        continue
    out.append({"model": args.model_tag, "served_model_name": args.served_model_name,
                "host": args.host, "port": args.port,
                "speculative_config": args.speculative_config})
print(json.dumps(out))
"""


def vllm_commands() -> dict[str, list[str]]:
    """Every container command in both files but the gateway's, by ``file:service``; fails on
    a service that is neither the gateway nor ``vllm serve``."""
    commands = {}
    for name, svc in yaml.safe_load(COMPOSE.read_text())["services"].items():
        if name not in ("gateway", "redis"):
            commands[f"compose:{name}"] = svc["entrypoint"] + svc["command"]
    others = ("specgate-gateway", "specgate-redis")
    for doc in yaml.safe_load_all(MANIFESTS.read_text()):
        if doc and doc["kind"] == "Deployment" and doc["metadata"]["name"] not in others:
            for c in doc["spec"]["template"]["spec"]["containers"]:
                commands[f"k8s:{doc['metadata']['name']}/{c['name']}"] = c["command"] + c["args"]
    for where, argv in commands.items():
        assert argv[:2] == ["vllm", "serve"], f"{where} is neither the gateway nor vllm serve"
    return commands


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM environment not prepared")
def test_every_backend_command_parses_with_vllm() -> None:
    config = load_config(ROOT / SOURCE)
    commands = vllm_commands()
    assert len(commands) == 2 * len(config.backends)
    argvs = [argv[1:] for argv in commands.values()]  # "serve", model, flags...
    old_flag = [*argvs[0], "--speculative-model", "org/draft"]  # proves the parser is live
    parsed = run_in_vllm(PARSE_SERVE, [*argvs, old_flag], timeout_s=300)
    assert parsed[-1] == {"exit": 2}
    by_service = {service_name(name): b for name, b in config.backends.items()}
    for (where, _), got in zip(commands.items(), parsed, strict=False):
        backend = by_service[where.split(":")[1].split("/")[0]]
        profile = backend.profile
        assert got == {
            "model": profile.model,
            "served_model_name": [profile.served_model_name],
            "host": "0.0.0.0",
            "port": profile.port,
            "speculative_config": backend.spec.to_config() if backend.spec.speculative else None,
        }, where
