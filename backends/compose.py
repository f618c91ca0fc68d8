"""``specgate backends compose``: a Docker Compose file for the GPU stack of a config.

One ``vllm/vllm-openai`` service per backend with a launch profile: ``vllm serve`` with the
current ``--speculative-config`` form, its GPUs reserved by index
(``deploy.resources.reservations.devices`` with ``capabilities: [gpu]`` and ``device_ids``;
Compose docs, "GPU support"), ``ipc: host`` for PyTorch's shared memory (vLLM docs, "Using
Docker"), the host's Hugging Face cache mounted, and a health check on ``/health``. The
gateway service is built from ``docker/Dockerfile``, reads the config (URLs rewritten to the
service names) from an inline compose ``configs`` entry, and starts once every backend is
healthy (``depends_on: {condition: service_healthy}``). Its client keys and admin token are
required variables (``${SPECGATE_API_KEYS:?...}``), never literals: ``docker compose`` refuses
to start, naming the variable, until they are set (e.g. in an ``--env-file``). With
``admin="off"`` the admin endpoints are off and no token is asked for.

GPU indices: a profile's ``gpus``, else the lowest indices no other backend uses, as many as
its tensor-parallel size. Compose runs on one machine, so every backend must be on one node.
"""

from __future__ import annotations

from typing import Any

from backends.stack import (
    ADMIN_TOKEN_VAR,
    API_KEYS_VAR,
    GATEWAY_COMMAND,
    GATEWAY_CONFIG_PATH,
    GATEWAY_IMAGE,
    GATEWAY_PORT,
    HF_CACHE_IN_CONTAINER,
    REDIS_COMMAND,
    REDIS_IMAGE,
    STATE_URL_VAR,
    VLLM_IMAGE,
    AdminMode,
    StackBackend,
    StackError,
    dump_yaml,
    gateway_config_data,
    gateway_environment,
    gateway_health_command,
    gateway_secret_vars,
    health_command,
    stack_backends,
    stack_keep_alive_s,
)
from contracts.config import GatewayConfig

#: The compose service of the replicas' shared Redis (``state.backend: redis``).
REDIS_SERVICE = "redis"


def assign_gpus(backends: list[StackBackend]) -> dict[str, list[int]]:
    """GPU indices per backend name: explicit ``gpus`` first, then the lowest free ones.

    Raises :class:`StackError` when backends name different nodes.
    """
    nodes = {b.profile.node for b in backends if b.profile.node}
    if len(nodes) > 1:
        raise StackError(f"compose runs on one machine; backends name nodes {sorted(nodes)}")
    taken = {g for b in backends for g in b.profile.gpus or []}
    assigned: dict[str, list[int]] = {}
    next_free = 0
    for b in backends:
        if b.profile.gpus:
            assigned[b.name] = list(b.profile.gpus)
            continue
        mine: list[int] = []
        while len(mine) < b.gpu_count:
            if next_free not in taken:
                mine.append(next_free)
                taken.add(next_free)
            next_free += 1
        assigned[b.name] = mine
    return assigned


def _vllm_service(b: StackBackend, gpus: list[int], image: str) -> dict[str, Any]:
    return {
        "image": image,
        "entrypoint": ["vllm", "serve"],
        "command": b.args,
        "environment": {"HF_TOKEN": "${HF_TOKEN:-}", **b.profile.env},
        "volumes": [f"${{HF_HOME:-~/.cache/huggingface}}:{HF_CACHE_IN_CONTAINER}"],
        "ipc": "host",
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [
                        {
                            "driver": "nvidia",
                            "device_ids": [str(g) for g in gpus],
                            "capabilities": ["gpu"],
                        }
                    ]
                }
            }
        },
        "healthcheck": {
            "test": health_command(b.port),
            "interval": "15s",
            "timeout": "5s",
            "retries": 3,
            "start_period": "30m",  # downloading and loading weights
        },
        "restart": "unless-stopped",
    }


#: Where the documented commands keep the gateway's secrets (git-ignored).
ENV_FILE = "docker/specgate.env"


def _gateway_service(
    backends: list[StackBackend],
    image: str,
    admin: AdminMode,
    replicas: int,
    redis: bool,
    keep_alive_s: float | None,
) -> dict[str, Any]:
    environment = gateway_environment(admin, keep_alive_s)
    for var in gateway_secret_vars(admin):
        # compose interpolation: refuse to start, naming the variable, when it is unset or empty
        environment[var] = f"${{{var}:?set {var} (e.g. in {ENV_FILE}), see docs/deploy-gpu.md}}"
    if redis:  # another Redis (a URL with a password) from the operator's variables, if set
        environment[STATE_URL_VAR] = f"${{{STATE_URL_VAR}:-}}"
    # one host port per replica (8000, 8001, ...): put a load balancer in front of them
    last = GATEWAY_PORT + replicas - 1
    port = f"{GATEWAY_PORT}-{last}" if replicas > 1 else str(GATEWAY_PORT)
    depends: dict[str, Any] = {b.service: {"condition": "service_healthy"} for b in backends}
    if redis:  # started, not healthy: a replica serves without Redis and catches up later
        depends[REDIS_SERVICE] = {"condition": "service_started"}
    service: dict[str, Any] = {
        "build": {"context": "..", "dockerfile": "docker/Dockerfile"},
        "image": image,
        "command": GATEWAY_COMMAND,
        "environment": environment,
        "ports": [f"{port}:{GATEWAY_PORT}"],
        "configs": [{"source": "specgate", "target": GATEWAY_CONFIG_PATH}],
        "healthcheck": {
            "test": gateway_health_command(),
            "interval": "10s",
            "timeout": "5s",
            "retries": 3,
            "start_period": "10s",
        },
        "depends_on": depends,
        "restart": "unless-stopped",
    }
    if replicas > 1:
        service["deploy"] = {"replicas": replicas}
    return service


def _redis_service() -> dict[str, Any]:
    return {
        "image": REDIS_IMAGE,
        "command": REDIS_COMMAND,
        "healthcheck": {
            "test": ["CMD", "redis-cli", "ping"],
            "interval": "10s",
            "timeout": "3s",
            "retries": 3,
        },
        "restart": "unless-stopped",
    }


def _secrets_help(admin: AdminMode) -> str:
    lines = [f"# The gateway needs {API_KEYS_VAR} (client keys, comma-separated)"]
    lines[0] += f" and {ADMIN_TOKEN_VAR};" if admin == "token" else "; admin endpoints are off;"
    formats = "".join(f"{var}=%s\\n" for var in gateway_secret_vars(admin))
    values = " ".join('"$(openssl rand -hex 32)"' for _ in gateway_secret_vars(admin))
    lines += [
        "# compose refuses to start while one is unset. Create them once (git-ignored):",
        f"#   (umask 077; printf '{formats}' \\",
        f"#     {values} > {ENV_FILE})",
        "# Needs the NVIDIA Container Toolkit; set HF_TOKEN for gated models. Start with",
        f"#   docker compose --env-file {ENV_FILE} -f docker/compose.gpu.yaml up -d",
    ]
    return "\n".join(lines) + "\n"


def build_compose(
    config: GatewayConfig,
    source: str,
    *,
    vllm_image: str = VLLM_IMAGE,
    gateway_image: str = GATEWAY_IMAGE,
    admin: AdminMode = "token",
    gateway_replicas: int = 1,
) -> str:
    """The compose file for ``config`` (read from ``source``, named in the header) as YAML.

    ``admin`` is ``token`` (admin endpoints on, their token a required variable) or ``off``;
    ``gateway_replicas`` gateways on host ports 8000 upwards. With ``state.backend: redis``
    a ``redis`` service runs beside them and the config's ``state.url`` points at it.
    Raises :class:`StackError` when the config cannot run as containers.
    """
    backends = stack_backends(config)
    gpus = assign_gpus(backends)
    services: dict[str, Any] = {
        b.service: _vllm_service(b, gpus[b.name], vllm_image) for b in backends
    }
    redis = config.state.backend == "redis"
    config_text = dump_yaml(gateway_config_data(config, backends, REDIS_SERVICE))
    if redis:
        services[REDIS_SERVICE] = _redis_service()
    services["gateway"] = _gateway_service(
        backends, gateway_image, admin, gateway_replicas, redis, stack_keep_alive_s(config)
    )
    data = {
        "name": "specgate",
        "services": services,
        # "$" would be read as compose interpolation: "$$" is a literal dollar.
        "configs": {"specgate": {"content": config_text.replace("$", "$$")}},
    }
    placement = ", ".join(f"{b.name} -> GPU {','.join(map(str, gpus[b.name]))}" for b in backends)
    header = (
        f"# Generated by `specgate backends compose --config {source}`: do not edit, regenerate.\n"
        f"# GPUs: {placement}.\n" + _secrets_help(admin)
    )
    return header + dump_yaml(data)
