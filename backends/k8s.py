"""``specgate backends k8s``: Kubernetes manifests for the GPU stack of a config.

Per backend with a launch profile, a Deployment (one replica, ``Recreate`` so a rollout never
asks for twice the GPUs) running ``vllm serve`` with ``nvidia.com/gpu`` requested and limited
(NVIDIA device plugin), a startup probe that allows 30 minutes for download and load, and
readiness and liveness on ``/health``; plus a ClusterIP Service of the same name. The gateway
is a stateless Deployment (2 replicas by default, spread over nodes, a PodDisruptionBudget
keeping one up) behind a Service, ready on ``/ready`` (a healthy backend exists) and alive on
``/health``, its config from a ConfigMap whose backend URLs point at the Service names (same
namespace). The gateway's client keys and admin token come from the ``specgate-auth`` Secret
by reference (``secretKeyRef``, never a literal); the pod does not start until it exists.
With ``admin="off"`` the admin endpoints are off and the Secret holds only the client keys.
Every Secret the manifests name but do not create is in :func:`prerequisites` and in the file's
header, with the command that creates it. Nothing here talks to a cluster; apply with
``kubectl apply -n NS -f FILE``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from backends.stack import (
    ADMIN_TOKEN_VAR,
    API_KEYS_VAR,
    GATEWAY_COMMAND,
    GATEWAY_IMAGE,
    GATEWAY_PORT,
    HF_CACHE_IN_CONTAINER,
    REDIS_COMMAND,
    REDIS_IMAGE,
    REDIS_PORT,
    STATE_URL_VAR,
    VLLM_IMAGE,
    AdminMode,
    StackBackend,
    dump_yaml,
    dump_yaml_all,
    gateway_config_data,
    gateway_environment,
    gateway_secret_vars,
    stack_backends,
    stack_keep_alive_s,
)
from contracts.config import GatewayConfig

PART_OF = "specgate"
GATEWAY = "specgate-gateway"
#: The gateway pod's probe port (``SPECGATE_HEALTH_PORT``: /health and /ready from a thread).
GATEWAY_PROBE_PORT = 8001
CONFIG_MAP = "specgate-config"
HF_SECRET = "hf-token"
AUTH_SECRET = "specgate-auth"
#: The replicas' shared Redis (``state.backend: redis``): Deployment and Service name, and the
#: optional Secret whose ``url`` points the gateway at another Redis instead
REDIS = "specgate-redis"
REDIS_SECRET = "specgate-redis"
#: key in the ``specgate-auth`` Secret per gateway variable
AUTH_SECRET_KEYS = {API_KEYS_VAR: "api-keys", ADMIN_TOKEN_VAR: "admin-token"}


@dataclass(frozen=True)
class Prerequisite:
    """An object the manifests reference but do not create: ``kind``, ``name``, its ``keys``,
    whether pods start without it (``optional``), and the command that creates it."""

    kind: str
    name: str
    keys: tuple[str, ...]
    optional: bool
    create: str


def prerequisites(admin: AdminMode = "token", redis: bool = False) -> list[Prerequisite]:
    """What must exist in the namespace before ``kubectl apply``, for ``admin`` mode (and,
    with ``redis``, the optional Secret naming a Redis other than the generated one)."""
    keys = tuple(AUTH_SECRET_KEYS[var] for var in gateway_secret_vars(admin))
    create = "kubectl create secret generic {} -n NAMESPACE {}"
    random = " ".join(f'--from-literal={key}="$(openssl rand -hex 32)"' for key in keys)
    create_auth = create.format(AUTH_SECRET, random)
    create_hf = create.format(HF_SECRET, '--from-literal=token="$HF_TOKEN"')
    create_redis = create.format(
        REDIS_SECRET, '--from-literal=url="rediss://:PASSWORD@HOST:6379/0"'
    )
    return [
        Prerequisite("Secret", AUTH_SECRET, keys, False, create_auth),
        Prerequisite("Secret", HF_SECRET, ("token",), True, create_hf),
    ] + ([Prerequisite("Secret", REDIS_SECRET, ("url",), True, create_redis)] if redis else [])


def _labels(component: str, instance: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": component,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/part-of": PART_OF,
    }


def _meta(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "labels": labels}


def _probe(path: str, period: int, failures: int, port: str = "http") -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _service(name: str, labels: dict[str, str], port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, labels),
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [{"name": "http", "port": port, "targetPort": "http"}],
        },
    }


def _vllm_container(b: StackBackend, image: str) -> dict[str, Any]:
    gpus = str(b.gpu_count)
    token = {"secretKeyRef": {"name": HF_SECRET, "key": "token", "optional": True}}
    return {
        "name": "vllm",
        "image": image,
        "command": ["vllm", "serve"],
        "args": b.args,
        "env": [{"name": "HF_TOKEN", "valueFrom": token}]
        + [{"name": k, "value": v} for k, v in b.profile.env.items()],
        "ports": [{"name": "http", "containerPort": b.port}],
        "resources": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}},
        "startupProbe": _probe("/health", 10, 180),
        "readinessProbe": _probe("/health", 10, 3),
        "livenessProbe": _probe("/health", 30, 3),
        "volumeMounts": [
            {"name": "hf-cache", "mountPath": HF_CACHE_IN_CONTAINER},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }


def backend_manifests(b: StackBackend, image: str = VLLM_IMAGE) -> list[dict[str, Any]]:
    """The Deployment and Service of one vLLM backend."""
    labels = _labels("vllm", b.service)
    pod: dict[str, Any] = {
        "containers": [_vllm_container(b, image)],
        "volumes": [
            {"name": "hf-cache", "emptyDir": {}},  # swap for a PersistentVolumeClaim to keep
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        ],
    }
    if b.profile.node:
        pod["nodeSelector"] = {"kubernetes.io/hostname": b.profile.node}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(b.service, labels),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    return [deployment, _service(b.service, labels, b.port)]


def _gateway_env(admin: AdminMode, redis: bool, keep_alive_s: float | None) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in gateway_environment(admin, keep_alive_s).items()
    ]
    for var in gateway_secret_vars(admin):
        ref = {"name": AUTH_SECRET, "key": AUTH_SECRET_KEYS[var]}  # not optional: no pod without
        env.append({"name": var, "valueFrom": {"secretKeyRef": ref}})
    if redis:  # optional: without the Secret, the config's URL (the generated Redis) is used
        other = {"name": REDIS_SECRET, "key": "url", "optional": True}
        env.append({"name": STATE_URL_VAR, "valueFrom": {"secretKeyRef": other}})
    return env


def redis_manifests() -> list[dict[str, Any]]:
    """Deployment and Service of the replicas' shared Redis: one pod, no persistence (the
    replicas publish their state again when it restarts empty), unprivileged."""
    labels = _labels("redis", REDIS)
    probe = {"tcpSocket": {"port": "redis"}, "periodSeconds": 10, "timeoutSeconds": 3}
    container = {
        "name": "redis",
        "image": REDIS_IMAGE,
        "command": REDIS_COMMAND,
        "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
        "readinessProbe": probe,
        "livenessProbe": probe | {"failureThreshold": 3},
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 999,  # the image's redis user
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(REDIS, labels),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": [container],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(REDIS, labels),
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis"}],
        },
    }
    return [deployment, service]


def _gateway_pod(
    config_sha: str,
    labels: dict[str, str],
    image: str,
    admin: AdminMode,
    redis: bool,
    keep_alive_s: float | None,
) -> dict[str, Any]:
    container = {
        "name": "gateway",
        "image": image,
        "command": GATEWAY_COMMAND,
        "env": [
            *_gateway_env(admin, redis, keep_alive_s),
            {"name": "SPECGATE_HEALTH_PORT", "value": str(GATEWAY_PROBE_PORT)},
        ],
        "ports": [
            {"name": "http", "containerPort": GATEWAY_PORT},
            {"name": "probes", "containerPort": GATEWAY_PROBE_PORT},
        ],
        # on the probe port: answered by a thread of its own, never queued behind requests
        # (gateway/probe_port.py), so a loaded pod is not restarted or taken out for load
        "readinessProbe": _probe("/ready", 5, 2, "probes"),
        "livenessProbe": _probe("/health", 10, 3, "probes"),
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"memory": "512Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/specgate", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    spread = {
        "weight": 100,
        "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": labels},
        },
    }
    return {
        "metadata": {"labels": labels, "annotations": {"specgate/config-sha256": config_sha}},
        "spec": {
            "automountServiceAccountToken": False,  # the gateway never calls the API server
            "containers": [container],
            "affinity": {
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [spread]}
            },
            "volumes": [
                {"name": "config", "configMap": {"name": CONFIG_MAP}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }


def gateway_manifests(
    config_text: str,
    image: str = GATEWAY_IMAGE,
    replicas: int = 2,
    admin: AdminMode = "token",
    redis: bool = False,
    keep_alive_s: float | None = None,
) -> list[dict[str, Any]]:
    """ConfigMap, Deployment, PodDisruptionBudget and Service of the gateway (``redis``: its
    pods may take ``SPECGATE_STATE_URL`` from the optional ``specgate-redis`` Secret;
    ``keep_alive_s``: its ``SPECGATE_BACKEND_KEEP_ALIVE_S``, seconds).

    The pod template carries the config's sha256, so a changed config rolls the pods.
    """
    labels = _labels("specgate-gateway", GATEWAY)
    sha = hashlib.sha256(config_text.encode()).hexdigest()
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(CONFIG_MAP, labels),
        "data": {"specgate.yaml": config_text},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(GATEWAY, labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": _gateway_pod(sha, labels, image, admin, redis, keep_alive_s),
        },
    }
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(GATEWAY, labels),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
    }
    return [config_map, deployment, budget, _service(GATEWAY, labels, GATEWAY_PORT)]


def build_manifests(
    config: GatewayConfig,
    source: str,
    *,
    vllm_image: str = VLLM_IMAGE,
    gateway_image: str = GATEWAY_IMAGE,
    gateway_replicas: int = 2,
    admin: AdminMode = "token",
) -> str:
    """Every manifest for ``config`` (read from ``source``) as one multi-document YAML.

    ``admin`` is ``token`` (admin endpoints on, the token from the ``specgate-auth`` Secret)
    or ``off``; the header lists the Secrets to create first (:func:`prerequisites`).

    Raises :class:`~backends.stack.StackError` when the config cannot run as containers.
    """
    backends = stack_backends(config)
    redis = config.state.backend == "redis"
    docs: list[dict[str, Any]] = []
    for b in backends:
        docs += backend_manifests(b, vllm_image)
    if redis:
        docs += redis_manifests()
    config_text = dump_yaml(gateway_config_data(config, backends, REDIS))
    keep_alive_s = stack_keep_alive_s(config)
    docs += gateway_manifests(
        config_text, gateway_image, gateway_replicas, admin, redis, keep_alive_s
    )
    lines = [f"# Generated by `specgate backends k8s --config {source}`: do not edit, regenerate."]
    if gateway_replicas > 1 and not redis:
        lines.append(
            f"# {gateway_replicas} gateway replicas learn alone: set state.backend: redis in the "
            'config to share (README, "More than one gateway")'
        )
    lines.append("# Create first (prerequisites: referenced here, not generated):")
    for p in prerequisites(admin, redis):
        why = "optional" if p.optional else "required: pods wait for it"
        why += {HF_SECRET: ", for gated models", REDIS_SECRET: ", another Redis"}.get(p.name, "")
        lines += [f"#   {p.kind} {p.name} (keys: {', '.join(p.keys)}; {why}):", f"#     {p.create}"]
    lines.append("# Apply with: kubectl apply -n NAMESPACE -f docker/k8s/specgate.yaml")
    header = "\n".join(lines) + "\n"
    return header + dump_yaml_all(docs)
