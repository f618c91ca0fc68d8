"""Turn a generated compose file or Kubernetes manifest into what its runtime would run.

For the gateway service, :func:`compose_gateway` and :func:`k8s_gateway` return a
:class:`ContainerRun`: the argv (compose ``entrypoint`` + ``command``, Kubernetes ``command`` +
``args``), the environment (compose ``${VAR:?msg}`` / ``${VAR:-default}`` interpolation with
the variables given; Kubernetes ``value`` and ``valueFrom.secretKeyRef`` /
``configMapKeyRef`` read from the objects and test secrets given), the files mounted into the
container (compose ``configs``, Kubernetes ``configMap`` volumes) and the declared health check
(compose ``healthcheck.test``, Kubernetes httpGet probes). A mounted path ``/etc/x`` becomes
``ROOT/etc/x`` on this machine, and environment values naming a mounted path are rewritten
the same way: that is the only change from what the container would see.

:func:`compose_backends` and :func:`k8s_backends` list the backend services the gateway
reaches by name (service name, port, served model name), for fakes to stand in at those
names (and the replicas' Redis, whose command the sandbox runs as written). Anything these
runtimes do that is not emulated here (compose ``secrets``, ``env_file``, ``volumes``;
Kubernetes ``envFrom``, ``$(VAR)`` expansion, other volume kinds) raises
:class:`DeploymentError` instead of being silently skipped.
"""

from __future__ import annotations

import argparse
import re
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class DeploymentError(Exception):
    """The runtime would refuse this deployment (message as it would say it), or the file
    uses something this emulation does not cover."""


@dataclass
class ContainerRun:
    """One container as its runtime would start it; files are written under ``root``."""

    argv: list[str]
    env: dict[str, str]
    files: dict[Path, str] = field(default_factory=dict)
    health_argv: list[str] | None = None  # compose: a command exiting 0 when healthy
    probe_paths: list[str] = field(default_factory=list)  # Kubernetes: httpGet paths
    port: int = 0  # the container port the gateway listens on (clients use it)
    probe_port: int | None = None  # Kubernetes: the port its probes name (None: ``port``)

    def write_files(self) -> None:
        """Create the mounted files on this machine."""
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")


@dataclass(frozen=True)
class BackendService:
    """A service the gateway reaches by ``host:port``, serving ``model``; ``argv``: the
    command of a service that is no vLLM (the replicas' ``redis-server``), run as written."""

    host: str
    port: int
    model: str
    argv: tuple[str, ...] | None = None


#: The one service besides the gateway and vLLM that the files may run.
REDIS_SERVER = "redis-server"
REDIS_PORT = 6379


# -- compose ------------------------------------------------------------------------------


class _ComposeTemplate(string.Template):
    """``string.Template`` with compose's braced forms: ``${VAR:-default}``, ``${VAR-d}``,
    ``${VAR:?message}``, ``${VAR?m}``, ``${VAR:+alt}``; ``$$`` is a literal dollar."""

    braceidpattern = r"[_a-z][_a-z0-9]*(?::?[-?+][^}]*)?"


class _ComposeVariables(Mapping[str, str]):
    """Resolves one ``${...}`` expression against the variables, as compose does."""

    def __init__(self, variables: Mapping[str, str]) -> None:
        self._variables = variables

    def __getitem__(self, expression: str) -> str:
        found = re.fullmatch(r"(\w+)(?:(:?)([-?+])(.*))?", expression, re.S)
        assert found is not None, expression
        name, colon, op, arg = found.groups()
        value = self._variables.get(name)
        unset = value is None or (bool(colon) and value == "")
        if op == "?" and unset:
            raise DeploymentError(f"required variable {name} is missing a value: {arg}")
        if op == "-":
            return arg if unset else str(value)
        if op == "+":
            return "" if unset else arg
        return value or ""

    def __iter__(self) -> Iterator[str]:
        return iter(self._variables)

    def __len__(self) -> int:
        return len(self._variables)


def interpolate(data: Any, variables: Mapping[str, str]) -> Any:
    """``data`` (parsed compose YAML) with every string value interpolated.

    Raises :class:`DeploymentError` for a required variable that is unset or empty.
    """
    if isinstance(data, str):
        return _ComposeTemplate(data).substitute(_ComposeVariables(variables))
    if isinstance(data, list):
        return [interpolate(v, variables) for v in data]
    if isinstance(data, dict):
        return {k: interpolate(v, variables) for k, v in data.items()}
    return data


def _health_argv(test: str | list[str]) -> list[str]:
    if isinstance(test, str):
        return ["/bin/sh", "-c", test]
    if test[0] == "CMD":
        return list(test[1:])
    if test[0] == "CMD-SHELL":
        return ["/bin/sh", "-c", test[1]]
    raise DeploymentError(f"healthcheck test {test[0]!r} is not emulated")


def compose_gateway(
    text: str, variables: Mapping[str, str], root: Path, service: str = "gateway"
) -> ContainerRun:
    """The compose ``service`` as ``docker compose up`` would run it, with ``variables``
    as the shell / ``--env-file`` variables."""
    data = interpolate(yaml.safe_load(text), variables)
    svc = data["services"][service]
    unsupported = {"secrets", "env_file", "volumes", "entrypoint"} & set(svc)
    if unsupported:
        raise DeploymentError(f"compose keys {sorted(unsupported)} are not emulated")
    if "command" not in svc:
        raise DeploymentError(f"service {service} names no command (the image's CMD is unseen)")
    env = {k: "" if v is None else str(v) for k, v in svc.get("environment", {}).items()}
    files: dict[Path, str] = {}
    for ref in svc.get("configs", []):
        ref = {"source": ref} if isinstance(ref, str) else ref
        target = ref.get("target", "/" + ref["source"])
        config = data["configs"][ref["source"]]
        if "content" not in config:
            raise DeploymentError(f"config {ref['source']}: only inline content is emulated")
        files[Path(target)] = config["content"]
    health = svc.get("healthcheck", {}).get("test")
    published = svc.get("ports", [])
    if len(published) != 1:
        raise DeploymentError(f"service {service} publishes {published}, expected one port")
    run = ContainerRun(
        argv=list(svc["command"]),
        env=env,
        health_argv=None if health is None else _health_argv(health),
        port=int(str(published[0]).rsplit(":", 1)[-1]),  # HOST:CONTAINER
    )
    return _rooted(run, files, root)


def _served_model(argv: list[str]) -> tuple[int, str]:
    """(port, served model name) of a ``vllm serve MODEL ...`` argv, vLLM's defaults else."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("model")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    args, _ = parser.parse_known_args(argv)
    return args.port, (args.served_model_name or [args.model])[0]


def compose_backends(text: str, gateway: str = "gateway") -> list[BackendService]:
    """Every service but the gateway, as ``vllm serve``: its name, port and model."""
    services = yaml.safe_load(text)["services"]
    out = []
    for name, svc in services.items():
        if name == gateway:
            continue
        if "entrypoint" not in svc and svc.get("command", [None])[0] == REDIS_SERVER:
            out.append(BackendService(name, REDIS_PORT, "", tuple(svc["command"])))
            continue
        if svc.get("entrypoint") != ["vllm", "serve"]:
            raise DeploymentError(f"service {name} is neither the gateway nor `vllm serve`")
        port, model = _served_model(svc["command"])
        out.append(BackendService(name, port, model))
    return out


# -- Kubernetes ---------------------------------------------------------------------------


def _objects(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}


def _env_value(
    item: dict[str, Any],
    objects: dict[tuple[str, str], dict[str, Any]],
    secrets: Mapping[str, Mapping[str, str]],
) -> str | None:
    if "value" in item:
        if "$(" in str(item["value"]):
            raise DeploymentError(f"{item['name']}: $(VAR) expansion is not emulated")
        return str(item["value"])
    source = item["valueFrom"]
    if "secretKeyRef" in source:
        ref, data = source["secretKeyRef"], secrets.get(source["secretKeyRef"]["name"])
        kind = "secret"
    elif "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        found = objects.get(("ConfigMap", ref["name"]))
        data, kind = (None if found is None else found.get("data", {})), "configmap"
    else:
        raise DeploymentError(f"{item['name']}: valueFrom {sorted(source)} is not emulated")
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        missing = f'{kind} "{ref["name"]}" not found' if data is None else f"key {ref['key']}"
        raise DeploymentError(f"CreateContainerConfigError: {missing} ({item['name']})")
    return str(data[ref["key"]])


def k8s_gateway(
    text: str,
    secrets: Mapping[str, Mapping[str, str]],
    root: Path,
    deployment: str = "specgate-gateway",
) -> ContainerRun:
    """The ``deployment``'s single container as the kubelet would start it, with ``secrets``
    (name -> key -> value) standing in for the namespace's Secrets."""
    objects = _objects(text)
    pod = objects[("Deployment", deployment)]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    if "envFrom" in container:
        raise DeploymentError("envFrom is not emulated")
    env = {}
    for item in container.get("env", []):
        value = _env_value(item, objects, secrets)
        if value is not None:
            env[item["name"]] = value
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files: dict[Path, str] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            data = objects[("ConfigMap", volume["configMap"]["name"])].get("data", {})
            for key, content in data.items():
                files[Path(mount["mountPath"]) / key] = content
        elif "emptyDir" not in volume:
            raise DeploymentError(f"volume {mount['name']}: only configMap/emptyDir emulated")
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    probes = [
        container[k]["httpGet"]
        for k in ("startupProbe", "readinessProbe", "livenessProbe")
        if k in container
    ]
    probe_ports = {ports.get(p["port"], p["port"]) for p in probes}
    if len(probe_ports) != 1:
        raise DeploymentError(f"probes name ports {probe_ports}, container ports {ports}")
    probe_port = int(probe_ports.pop())
    run = ContainerRun(
        argv=list(container.get("command", [])) + list(container.get("args", [])),
        env=env,
        probe_paths=[p["path"] for p in probes],
        port=int(ports.get("http", probe_port)),
        probe_port=probe_port,
    )
    return _rooted(run, files, root)


def k8s_backends(text: str, gateway: str = "specgate-gateway") -> list[BackendService]:
    """Every Service but the gateway's: its name, port and the model its pods serve."""
    objects = _objects(text)
    out = []
    for (kind, name), service in objects.items():
        if kind != "Service" or name == gateway:
            continue
        selector = service["spec"]["selector"]
        pods = [
            d["spec"]["template"]
            for (k, _), d in objects.items()
            if k == "Deployment"
            and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        (pod,) = pods
        (container,) = pod["spec"]["containers"]
        if container.get("command", [None])[0] == REDIS_SERVER and "args" not in container:
            for port in service["spec"]["ports"]:
                out.append(BackendService(name, int(port["port"]), "", tuple(container["command"])))
            continue
        if container.get("command") != ["vllm", "serve"]:
            raise DeploymentError(f"Service {name} selects neither the gateway nor `vllm serve`")
        listens, model = _served_model(container["args"])
        named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if named.get(target, target) != listens:
                raise DeploymentError(f"Service {name} targets {target}, vLLM listens on {listens}")
            out.append(BackendService(name, int(port["port"]), model))
    return out


def _rooted(run: ContainerRun, files: dict[Path, str], root: Path) -> ContainerRun:
    """Place mounted files under ``root`` and point environment values at them (and at the
    container's own ``/tmp``, which is private to each container)."""
    run.files = {root / path.relative_to("/"): text for path, text in files.items()}
    mounted = [str(p) for p in files] + ["/tmp/"]
    for name, value in run.env.items():
        if any(value == m or value.startswith(m.rstrip("/") + "/") for m in mounted):
            run.env[name] = str(root / value.lstrip("/"))
    return run
