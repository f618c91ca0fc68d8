"""docker/compose.gpu.yaml and docker/k8s/specgate.yaml: current, schema-valid, consistent.

Validators run offline: the compose file against the compose-spec JSON schema that
check-jsonschema vendors (``--builtin-schema vendor.compose-spec``), the manifests against the
Kubernetes JSON schemas that kubernetes-validate ships (strict: unknown fields are errors).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from backends.compose import build_compose
from backends.k8s import build_manifests, prerequisites
from backends.stack import ADMIN_TOKEN_VAR, API_KEYS_VAR, GATEWAY_CONFIG_PATH, StackError
from cli.main import main
from contracts.config import load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "config/production.example.yaml"
COMPOSE = ROOT / "docker" / "compose.gpu.yaml"
MANIFESTS = ROOT / "docker" / "k8s" / "specgate.yaml"
DEPLOY_DOC = ROOT / "docs" / "deploy-gpu.md"
KUBERNETES_VERSION = "1.30"
REGENERATE = "regenerate: specgate backends {} --config config/production.example.yaml -o {}"


def production() -> Any:
    return load_config(ROOT / SOURCE)


def load_all(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def check_compose_schema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec"]
        + [str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_committed_compose_file_is_current() -> None:
    expected = build_compose(production(), SOURCE)
    assert COMPOSE.read_text() == expected, REGENERATE.format("compose", "docker/compose.gpu.yaml")


def test_committed_manifests_are_current() -> None:
    expected = build_manifests(production(), SOURCE)
    assert MANIFESTS.read_text() == expected, REGENERATE.format("k8s", "docker/k8s/")


def test_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    proc = check_compose_schema(COMPOSE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = yaml.safe_load(COMPOSE.read_text())
    data["services"]["vllm-plain"]["deploy"]["resources"]["reservations"]["devices"][0].pop(
        "capabilities"
    )
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(data))
    proc = check_compose_schema(broken)  # the validator is live: a required key is missing
    assert proc.returncode == 1 and "capabilities" in proc.stdout


def test_compose_services() -> None:
    data = yaml.safe_load(COMPOSE.read_text())
    services = data["services"]
    config = production()
    assert set(services) == {f"vllm-{name}" for name in config.backends} | {"gateway", "redis"}
    seen_gpus: list[str] = []
    for name, backend in config.backends.items():
        service = services[f"vllm-{name}"]
        assert service["image"].startswith("vllm/vllm-openai:")
        assert service["entrypoint"] == ["vllm", "serve"]
        command = service["command"]
        assert command[0] == backend.profile.model and "--model" not in command
        assert not any(a.startswith(("--speculative-model", "--num-speculative")) for a in command)
        if backend.spec.speculative:
            spec = json.loads(command[command.index("--speculative-config") + 1])
            assert spec == backend.spec.to_config()
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
        seen_gpus += device["device_ids"]
        assert "/health" in " ".join(service["healthcheck"]["test"])
        assert services["gateway"]["depends_on"][f"vllm-{name}"] == {"condition": "service_healthy"}
    assert sorted(seen_gpus) == ["0", "1", "2", "3"]  # one GPU each, none shared
    gateway = services["gateway"]
    assert gateway["configs"] == [{"source": "specgate", "target": GATEWAY_CONFIG_PATH}]
    assert gateway["environment"]["SPECGATE_CONFIG"] == GATEWAY_CONFIG_PATH
    for var in (API_KEYS_VAR, ADMIN_TOKEN_VAR):  # from the operator's variables, never literal
        assert gateway["environment"][var].startswith(f"${{{var}:?set {var}")
    mounted = parse_config(yaml.safe_load(data["configs"]["specgate"]["content"]))
    assert {n: b.base_url for n, b in mounted.backends.items()} == {
        n: f"http://vllm-{n}:8000" for n in config.backends
    }
    # the replicas' shared state: the Redis beside them, never waited for, another by variable
    assert mounted.state.backend == "redis" and mounted.state.url == "redis://redis:6379/0"
    assert services["redis"]["command"] == ["redis-server", "--save", "", "--appendonly", "no"]
    assert gateway["depends_on"]["redis"] == {"condition": "service_started"}
    assert gateway["environment"]["SPECGATE_STATE_URL"] == "${SPECGATE_STATE_URL:-}"
    assert gateway["ports"] == ["8000:8000"] and "deploy" not in gateway  # one by default


def test_manifests_validate_against_kubernetes_schemas() -> None:
    docs = load_all(MANIFESTS.read_text())
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    broken = docs[0] | {"spec": docs[0]["spec"] | {"replicas": "one"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_manifest_contents() -> None:
    docs = load_all(MANIFESTS.read_text())
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    config = production()
    for name in config.backends:
        deployment = by_kind["Deployment"][f"vllm-{name}"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        resources = container["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/health"
        service = by_kind["Service"][f"vllm-{name}"]
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    gateway = by_kind["Deployment"]["specgate-gateway"]
    assert gateway["spec"]["replicas"] >= 2
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "specgate-gateway" in by_kind["Service"]
    env = {item["name"]: item for item in container["env"]}
    # both probes on the probe port, which the gateway is told to open
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    for kind in ("readinessProbe", "livenessProbe"):
        assert container[kind]["httpGet"]["port"] == "probes"
    assert env["SPECGATE_HEALTH_PORT"]["value"] == str(ports["probes"])
    assert ports["probes"] != ports["http"]
    for var in (API_KEYS_VAR, ADMIN_TOKEN_VAR):  # from the Secret by reference, never literal
        assert "value" not in env[var]
        assert env[var]["valueFrom"]["secretKeyRef"]["name"] == "specgate-auth"
    text = by_kind["ConfigMap"]["specgate-config"]["data"]["specgate.yaml"]
    mounted = parse_config(yaml.safe_load(text))
    for backend in mounted.backends.values():
        host = re.match(r"http://([^:]+):", backend.base_url)
        assert host is not None and host.group(1) in by_kind["Service"]
        assert not backend.local


def test_local_models_cannot_become_containers() -> None:
    with pytest.raises(StackError, match="built on this machine"):
        build_compose(load_config(ROOT / "config" / "local.yaml"), "config/local.yaml")


def test_cli_writes_files(tmp_path: Path) -> None:
    args = ["backends", "compose", "--config", str(ROOT / SOURCE), "-o", str(tmp_path / "c.yaml")]
    assert main(args) == 0
    assert "vllm-draft" in yaml.safe_load((tmp_path / "c.yaml").read_text())["services"]
    (tmp_path / "k8s").mkdir()
    args = ["backends", "k8s", "--config", str(ROOT / SOURCE), "-o", str(tmp_path / "k8s")]
    assert main([*args, "--replicas", "3"]) == 0
    docs = load_all((tmp_path / "k8s" / "specgate.yaml").read_text())
    (gateway,) = [d for d in docs if d["kind"] == "Deployment" and "gateway" in str(d["metadata"])]
    assert gateway["spec"]["replicas"] == 3
    assert main(["backends", "compose", "--config", str(ROOT / "config" / "local.yaml")]) == 1
    off = ["backends", "compose", "--config", str(ROOT / SOURCE), "--admin", "off"]
    assert main([*off, "-o", str(tmp_path / "off.yaml")]) == 0
    services = yaml.safe_load((tmp_path / "off.yaml").read_text())["services"]
    assert services["gateway"]["environment"]["SPECGATE_ADMIN_ENABLED"] == "false"
    assert ADMIN_TOKEN_VAR not in services["gateway"]["environment"]


def test_dockerfile_copies_existing_paths_and_runs_unprivileged() -> None:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    assert "USER 10001" in text
    assert re.search(r"HEALTHCHECK .*\n.*/health", text)


def test_compose_assigns_free_gpus_and_needs_one_node() -> None:
    def backend(port: int, **fields: Any) -> dict[str, Any]:
        profile = {"model": "org/m", "served_model_name": "m", "port": port, **fields}
        return {"profile": profile}

    data: dict[str, Any] = {
        "defaults": {"pool": "all"},
        "backends": {
            "a": backend(8001, tensor_parallel_size=2),
            "b": backend(8002, gpus=[1]),
            "c": backend(8003),
        },
        "pools": {"all": ["a", "b", "c"]},
    }
    services = yaml.safe_load(build_compose(parse_config(data), "x.yaml"))["services"]
    ids = {
        name: s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for name, s in services.items()
        if name != "gateway"
    }
    assert ids == {"vllm-a": ["0", "2"], "vllm-b": ["1"], "vllm-c": ["3"]}
    data["backends"]["b"]["profile"]["node"] = "other"
    data["backends"]["c"]["profile"]["node"] = "elsewhere"
    with pytest.raises(StackError, match="one machine"):
        build_compose(parse_config(data), "x.yaml")


#: fields that name another object: field -> (kind, the key holding the name)
REFERENCES = {
    "secretKeyRef": ("Secret", "name"),
    "secretRef": ("Secret", "name"),
    "secret": ("Secret", "secretName"),
    "configMapKeyRef": ("ConfigMap", "name"),
    "configMapRef": ("ConfigMap", "name"),
    "configMap": ("ConfigMap", "name"),
    "persistentVolumeClaim": ("PersistentVolumeClaim", "claimName"),
}


def references(
    node: Any, found: set[tuple[str, str, str]] | None = None
) -> set[tuple[str, str, str]]:
    """(kind, name, key) of every object ``node`` names (key "" unless a secretKeyRef or
    configMapKeyRef): Secrets, ConfigMaps, PVCs, ServiceAccounts, image pull Secrets."""
    found = set() if found is None else found
    if isinstance(node, list):
        for item in node:
            references(item, found)
    elif isinstance(node, dict):
        for field, value in node.items():
            if field in REFERENCES and isinstance(value, dict):
                kind, name = REFERENCES[field]
                found.add((kind, value[name], value.get("key", "")))
            elif field in ("serviceAccountName", "serviceAccount"):
                found.add(("ServiceAccount", value, ""))
            elif field == "imagePullSecrets":
                found |= {("Secret", item["name"], "") for item in value}
            references(value, found)
    return found


@pytest.mark.parametrize("admin", ["token", "off"])
def test_every_referenced_object_is_generated_or_a_documented_prerequisite(admin: str) -> None:
    text = (
        MANIFESTS.read_text()
        if admin == "token"
        else build_manifests(production(), SOURCE, admin="off")  # type: ignore[arg-type]
    )
    docs = load_all(text)
    generated = {(d["kind"], d["metadata"]["name"]) for d in docs}
    named = references(docs)
    outside = {(kind, name) for kind, name, _ in named} - generated
    required = {(p.kind, p.name): p for p in prerequisites(admin, redis=True)}  # type: ignore[arg-type]
    assert outside == set(required), "document every object referenced and not generated"
    for kind, name, key in named:
        if key and (kind, name) in required:
            assert key in required[kind, name].keys, f"{kind} {name} key {key} undocumented"
    header = text.split("\napiVersion:", 1)[0]
    guide = DEPLOY_DOC.read_text()
    for p in required.values():
        assert p.create in header  # the file says how to create it
        assert f"kubectl create secret generic {p.name}" in guide
        assert all(f"--from-literal={key}=" in guide for key in p.keys)
    # the walk is live: a PersistentVolumeClaim nobody documents would be caught
    volumes = docs[0]["spec"]["template"]["spec"]["volumes"]
    volumes[0] = {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}
    assert ("PersistentVolumeClaim", "hf-cache", "") in references(docs)


def test_replicas_share_state_through_the_generated_redis(tmp_path: Path) -> None:
    docs = load_all(MANIFESTS.read_text())
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    redis = by_name["Deployment", "specgate-redis"]
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["redis-server", "--save", "", "--appendonly", "no"]
    assert container["securityContext"]["runAsNonRoot"] is True
    service = by_name["Service", "specgate-redis"]
    assert service["spec"]["selector"] == redis["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 6379
    gateway = by_name["Deployment", "specgate-gateway"]
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    ref = env["SPECGATE_STATE_URL"]["valueFrom"]["secretKeyRef"]  # by reference, optional
    assert ref == {"name": "specgate-redis", "key": "url", "optional": True}
    text = by_name["ConfigMap", "specgate-config"]["data"]["specgate.yaml"]
    mounted = parse_config(yaml.safe_load(text))
    assert mounted.state.url == "redis://specgate-redis:6379/0"
    # N replicas in compose: one host port each, schema-valid
    three = build_compose(production(), SOURCE, gateway_replicas=3)
    (tmp_path / "three.yaml").write_text(three)
    proc = check_compose_schema(tmp_path / "three.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gw = yaml.safe_load(three)["services"]["gateway"]
    assert gw["deploy"] == {"replicas": 3} and gw["ports"] == ["8000-8002:8000"]


def test_without_redis_no_redis_is_generated_and_replicas_are_warned() -> None:
    data = production().model_dump(exclude_unset=True)
    del data["state"]
    embedded = parse_config(data)
    manifests = build_manifests(embedded, SOURCE, gateway_replicas=3)
    assert "# 3 gateway replicas learn alone: set state.backend: redis" in manifests
    docs = load_all(manifests)
    assert not [d for d in docs if "redis" in d["metadata"]["name"]]
    assert "SPECGATE_STATE_URL" not in manifests
    assert [p.name for p in prerequisites("token")] == ["specgate-auth", "hf-token"]
    services = yaml.safe_load(build_compose(embedded, SOURCE))["services"]
    assert (
        "redis" not in services and "SPECGATE_STATE_URL" not in services["gateway"]["environment"]
    )
    assert "replicas learn alone" not in build_manifests(embedded, SOURCE, gateway_replicas=1)


@pytest.mark.parametrize("external", [False, True])
def test_servers_outlast_the_gateways_keep_alive_when_the_stack_runs_them(external: bool) -> None:
    """The deployed servers keep idle connections 65 s and the gateway 60 s when the files
    run every backend; with a server run elsewhere (vLLM's 5 s) neither is set."""
    data = yaml.safe_load((ROOT / SOURCE).read_text())
    if external:
        data["backends"]["far"] = {"url": "http://10.0.0.9:8000", "model": "m"}
        data["pools"]["plain"] = [*data["pools"]["plain"], "far"]
    config = parse_config(data)
    services = yaml.safe_load(build_compose(config, SOURCE))["services"]
    docs = load_all(build_manifests(config, SOURCE))
    containers = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]
        for d in docs
        if d["kind"] == "Deployment"
    }
    k8s_env = {
        name: {e["name"]: e.get("value") for e in c.get("env", [])}
        for name, c in containers.items()
    }
    server = None if external else "65"
    gateway = None if external else "60"
    for name in ("vllm-plain", "vllm-ngram", "vllm-draft", "vllm-eagle3"):
        assert services[name]["environment"].get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE") == server
        assert k8s_env[name].get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE") == server
    assert services["gateway"]["environment"].get("SPECGATE_BACKEND_KEEP_ALIVE_S") == gateway
    assert k8s_env["specgate-gateway"].get("SPECGATE_BACKEND_KEEP_ALIVE_S") == gateway
