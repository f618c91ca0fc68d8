"""The deployed stack that compose and Kubernetes share: one vLLM service per backend, and the
gateway with its config rewritten to reach them by service name.

A backend with a launch profile becomes service ``vllm-<name>``: the ``vllm/vllm-openai``
image runs ``vllm serve`` with :func:`~contracts.launch_profile.build_serve_args` (the current
``--speculative-config`` form), listening on all interfaces at the profile's port. Backends
without a profile are external: the gateway keeps their URLs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from backends.keep_alive import DEFAULT_KEEP_ALIVE_S, gateway_keep_alive_s, with_idle_timeout
from backends.models import LOCAL_PREFIX
from contracts.config import GatewayConfig
from contracts.launch_profile import BackendProfile, build_serve_args

#: Default images; pin the vLLM tag you tested (``--vllm-image vllm/vllm-openai:vX.Y.Z``).
VLLM_IMAGE = "vllm/vllm-openai:latest"
GATEWAY_IMAGE = "specgate-gateway:latest"
#: Where the gateway container reads its config, and the port it serves on.
GATEWAY_CONFIG_PATH = "/etc/specgate/specgate.yaml"
GATEWAY_PORT = 8000
#: Hugging Face cache inside the vLLM image (it runs as root).
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
#: What runs in the gateway container (the image's ``CMD``, stated so the files say it).
GATEWAY_COMMAND = ["specgate", "serve"]
#: The gateway's secrets, as the variables it reads (gateway/settings.py).
ADMIN_TOKEN_VAR = "SPECGATE_ADMIN_TOKEN"
API_KEYS_VAR = "SPECGATE_API_KEYS"
#: ``token``: admin endpoints (``/routes*``, ``/status``) on, guarded by the admin token from
#: the deployment's secret (the gateway does not start without it); ``off``: admin endpoints
#: off, no token needed. Client keys are always required.
AdminMode = Literal["token", "off"]
#: The replicas' shared state (config ``state.backend: redis``): the Redis the files run
#: beside the gateway (no persistence: what it holds is rebuilt by the replicas, see the
#: README's "More than one gateway"), its port, and the variable that points the gateway at
#: another one (a URL with a password, from a secret).
REDIS_IMAGE = "redis:7.4-alpine"
REDIS_PORT = 6379
REDIS_COMMAND = ["redis-server", "--save", "", "--appendonly", "no"]
STATE_URL_VAR = "SPECGATE_STATE_URL"
ADMIN_MODES: tuple[AdminMode, ...] = ("token", "off")


class StackError(ValueError):
    """The config cannot be deployed as containers (e.g. it uses models built locally)."""


@dataclass(frozen=True)
class StackBackend:
    """One vLLM service: config name, DNS-safe service name, profile and ``vllm serve`` args."""

    name: str
    service: str
    profile: BackendProfile
    args: list[str]

    @property
    def port(self) -> int:
        return self.profile.port

    @property
    def url(self) -> str:
        """What the gateway uses inside the stack, e.g. ``http://vllm-draft:8000``."""
        return f"http://{self.service}:{self.port}"

    @property
    def gpu_count(self) -> int:
        """GPUs to reserve: the profile's ``gpus``, else its tensor-parallel size."""
        return (
            len(self.profile.gpus) if self.profile.gpus else self.profile.tensor_parallel_size or 1
        )


def service_name(backend: str) -> str:
    """``vllm-<name>`` as a DNS label (RFC 1123: lower-case alphanumerics and ``-``)."""
    label = re.sub(r"[^a-z0-9-]+", "-", backend.lower()).strip("-")
    return f"vllm-{label}"[:63].rstrip("-")


def stack_keep_alive_s(config: GatewayConfig) -> float | None:
    """How long the deployed gateway keeps idle connections to the servers (seconds), as
    :func:`backends.keep_alive.gateway_keep_alive_s` gives it for the servers the stack runs
    (every backend with a profile); None when that is the gateway's default."""
    profiles = [b.profile for b in config.backends.values()]
    keep_alive_s = gateway_keep_alive_s(profiles, DEFAULT_KEEP_ALIVE_S, explicit=False)
    return None if keep_alive_s == DEFAULT_KEEP_ALIVE_S else keep_alive_s


def stack_backends(config: GatewayConfig) -> list[StackBackend]:
    """The config's backends that have a launch profile, as services, each keeping idle
    connections longer than the gateway (:func:`stack_keep_alive_s`) when that is not its
    default.

    Raises :class:`StackError` for a ``local:`` model (a folder built on this machine that no
    container has) or two backends whose service names collide.
    """
    out: list[StackBackend] = []
    keep_alive_s = stack_keep_alive_s(config)
    for name, backend in config.backends.items():
        profile = backend.profile
        if profile is None:
            continue
        for ref in (profile.model, profile.speculation.model):
            if ref and ref.startswith(LOCAL_PREFIX):
                raise StackError(
                    f"backend '{name}': model {ref} is built on this machine by `specgate "
                    "models prepare`; containers need a Hugging Face id or a mounted path"
                )
        container = profile.model_copy(update={"host": "0.0.0.0"})
        if keep_alive_s is not None:
            container = with_idle_timeout(container, keep_alive_s)
        out.append(StackBackend(name, service_name(name), container, build_serve_args(container)))
    services = [b.service for b in out]
    if len(set(services)) != len(services):
        raise StackError(f"backend names map to the same service name: {services}")
    return out


def gateway_config_data(
    config: GatewayConfig, backends: list[StackBackend], redis_host: str | None = None
) -> dict[str, Any]:
    """The gateway config as data (the fields the file set), each deployed backend's ``url``
    set to its service and ``local`` dropped (the orchestrator launches the servers, not
    ``specgate up``); with ``state.backend: redis``, ``state.url`` set to the Redis service
    ``redis_host``."""
    data = config.model_dump(mode="json", exclude_unset=True)
    if config.state.backend == "redis" and redis_host is not None:
        data["state"]["url"] = f"redis://{redis_host}:{REDIS_PORT}/0"
    for b in backends:
        entry = data["backends"][b.name]
        for derived in ("local", "model"):  # model comes from the profile
            entry.pop(derived, None)
        entry["url"] = b.url
    return data


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as ``|`` blocks and never uses aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    """YAML in insertion order, block style, 100 columns."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100)


def dump_yaml_all(documents: list[Any]) -> str:
    """Several YAML documents separated by ``---``."""
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, width=100)


def gateway_environment(admin: AdminMode, keep_alive_s: float | None = None) -> dict[str, str]:
    """The gateway container's plain (non-secret) variables: where it listens, its config,
    where it keeps what adaptive routing learnt (the writable /tmp of its own container: each
    replica learns on its own and keeps it across container restarts, see the README),
    ``SPECGATE_ADMIN_ENABLED=false`` when ``admin`` is ``off``, and
    ``SPECGATE_BACKEND_KEEP_ALIVE_S`` when ``keep_alive_s`` (seconds) is given
    (:func:`stack_keep_alive_s`)."""
    env = {
        "SPECGATE_CONFIG": GATEWAY_CONFIG_PATH,
        "SPECGATE_HOST": "0.0.0.0",
        "SPECGATE_PORT": str(GATEWAY_PORT),
        "SPECGATE_STATE_FILE": "/tmp/specgate/adaptive-routing.json",
    }
    if admin == "off":
        env["SPECGATE_ADMIN_ENABLED"] = "false"
    if keep_alive_s is not None:
        env["SPECGATE_BACKEND_KEEP_ALIVE_S"] = f"{keep_alive_s:g}"
    return env


def gateway_secret_vars(admin: AdminMode) -> list[str]:
    """The variables the gateway container takes from a secret: the client keys, and the
    admin token unless admin endpoints are off."""
    return [API_KEYS_VAR] + ([ADMIN_TOKEN_VAR] if admin == "token" else [])


def gateway_health_command() -> list[str]:
    """The gateway's container health check: ``/health`` on the port in ``SPECGATE_PORT``
    (as the image's ``HEALTHCHECK``), exit 0 on HTTP 200; needs only the image's python3."""
    code = (
        "import os, sys, urllib.request; "
        "port = os.environ.get('SPECGATE_PORT', '8000'); "
        "sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=5)"
        ".status != 200)"
    )
    return ["CMD", "python3", "-c", code]


def health_command(port: int, path: str = "/health") -> list[str]:
    """A container health check that needs only the image's python3 (exit 0 on HTTP 200)."""
    code = (
        "import sys, urllib.request; "
        f"sys.exit(urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=5)"
        ".status != 200)"
    )
    return ["CMD", "python3", "-c", code]
