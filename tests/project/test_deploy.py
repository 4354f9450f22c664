"""The deploy/ files stay true: real settings, real CLI commands, probes, GPUs, drains, volumes."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from voicehost.cli import build_parser
from voicehost.config import Settings

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
WORKER_DOCKERFILE = DEPLOY / "worker.Dockerfile"
GATEWAY_DOCKERFILE = DEPLOY / "gateway.Dockerfile"

SETTINGS = {f"VOICEHOST_{name.upper()}" for name in Settings.model_fields}
# Every other variable a container may set. Add to this on purpose, never to silence a typo.
OTHER_ENV = {
    "HF_HOME",  # where the weights are cached
    "HF_TOKEN",  # gated weights
    "PATH",
    "VIRTUAL_ENV",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "POD_NAME",  # downward API, for the worker id and advertise URL
    "POD_NAMESPACE",
    "POD_IP",
}
OTHER_ENV_PREFIXES = ("VLLM_",)
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


# --- reading the files -------------------------------------------------------------------------


def load_yaml(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def yaml_files() -> list[Path]:
    return sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])


def k8s_manifests() -> list[Path]:
    return sorted(p for p in K8S.glob("*.y*ml") if p.stem != "kustomization")


def k8s_docs() -> list[dict[str, Any]]:
    return [doc for path in k8s_manifests() for doc in load_yaml(path)]


def compose() -> dict[str, Any]:
    [doc] = load_yaml(COMPOSE)
    return doc


def k8s_find(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"want one {kind} {name}, found {len(found)}"
    return found[0]


def workloads() -> list[dict[str, Any]]:
    return [d for d in k8s_docs() if d["kind"] in WORKLOAD_KINDS]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return [*spec.get("initContainers", []), *spec["containers"]]


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, continuation lines joined, comments dropped."""
    instructions, current = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        word, _, rest = (current + line).partition(" ")
        instructions.append((word.upper(), rest.strip()))
        current = ""
    assert not current, f"{path.name} ends inside a continued line"
    return instructions


def dockerfile_env(path: Path) -> dict[str, str]:
    env = {}
    for word, rest in dockerfile(path):
        if word != "ENV":
            continue
        tokens = shlex.split(rest)
        if "=" in tokens[0]:
            env.update(token.split("=", 1) for token in tokens)
        else:  # the legacy form, `ENV NAME value`
            env[tokens[0]] = " ".join(tokens[1:])
    return env


def dockerfile_argv(rest: str) -> list[str]:
    """A CMD/ENTRYPOINT body: the exec form (JSON) or the shell form."""
    return json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]


def healthcheck_argv(rest: str) -> list[str]:
    if rest.split() == ["NONE"]:
        return []
    return dockerfile_argv(rest[rest.index("CMD") + len("CMD") :].strip())


def base_image(path: Path) -> str:
    """The last stage's FROM image, with the ARG defaults given before it filled in."""
    args, image = {}, ""
    for word, rest in dockerfile(path):
        if word == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value.strip("\"'")
        if word == "FROM":
            image = next(t for t in rest.split() if not t.startswith("--"))
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), image)
    return image


# --- shell and command lines -------------------------------------------------------------------

SHELL_OPERATORS = {";", "&", "&&", "|", "||", "(", ")", ";;", "{", "}"}
SHELL_PREFIXES = {"exec", "then", "else", "do", "!", "time", "nohup"}
MENTIONS_VOICEHOST = re.compile(r"(^|[\s;&|(])(\S*/)?voicehost(\s|$)")


def shell_commands(script: str) -> list[list[str]]:
    """Every simple command of a (one command a line) shell script, as argv."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        segment: list[str] = []
        for token in [*lexer, ";"]:
            if token not in SHELL_OPERATORS:
                segment.append(token)
                continue
            while segment and (
                segment[0] in SHELL_PREFIXES or re.match(r"[A-Za-z_]\w*=", segment[0])
            ):
                segment.pop(0)
            if segment:
                found.append(segment)
            segment = []
    return found


def voicehost_argvs(argv: list[str]) -> list[list[str]]:
    """The arguments (after ``voicehost``) of every voicehost call in argv and in its scripts."""
    calls = []
    if argv and argv[0].rsplit("/", 1)[-1] == "voicehost":
        calls.append(argv[1:])
    for arg in argv[1:]:
        # Only an argument that is itself a script (`sh -c "..."`, `trap '...'`); a word is a word.
        if len(arg.split()) > 1 and MENTIONS_VOICEHOST.search(arg):
            for command in shell_commands(arg):
                calls.extend(voicehost_argvs(command))
    return calls


def main_argv(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def compose_argv(value: str | list[str] | None) -> list[str]:
    """A compose command or healthcheck test as argv; ``$$`` is compose's escaped ``$``."""
    if value is None:
        return []
    if isinstance(value, str):
        return ["/bin/sh", "-c", value.replace("$$", "$")]
    if value and value[0] == "CMD-SHELL":
        return ["/bin/sh", "-c", " ".join(value[1:]).replace("$$", "$")]
    return [part.replace("$$", "$") for part in (value[1:] if value[0] == "CMD" else value)]


@dataclass(frozen=True)
class Call:
    where: str
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: voicehost {shlex.join(self.argv)}"


def voicehost_calls() -> list[Call]:
    """Every voicehost command line in the manifests, the compose file and the Dockerfiles."""
    found: list[tuple[str, list[str]]] = []
    for doc in workloads():
        for c in containers(doc):
            where = f"k8s {doc['metadata']['name']}/{c['name']}"
            found.append((where, main_argv(c)))
            found += [
                (where, hook.get("exec", {}).get("command", []))
                for hook in c.get("lifecycle", {}).values()
            ]
            found += [(where, c.get(p, {}).get("exec", {}).get("command", [])) for p in PROBES]
    for name, service in compose()["services"].items():
        for key in ("entrypoint", "command"):
            found.append((f"compose {name}", compose_argv(service.get(key))))
        found.append((f"compose {name}", compose_argv(service.get("healthcheck", {}).get("test"))))
    for path in sorted(DEPLOY.glob("*.Dockerfile")):
        for word, rest in dockerfile(path):
            if word in {"CMD", "ENTRYPOINT"}:
                found.append((f"{path.name} {word}", dockerfile_argv(rest)))
            elif word == "HEALTHCHECK":
                found.append((f"{path.name} {word}", healthcheck_argv(rest)))
            elif word == "RUN":
                found.append((f"{path.name} {word}", ["/bin/sh", "-c", rest]))
    return [Call(where, tuple(call)) for where, argv in found for call in voicehost_argvs(argv)]


def option(argv: list[str] | tuple[str, ...], flag: str) -> str:
    for i, arg in enumerate(argv):
        if arg == flag:
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} missing from {shlex.join(argv)}")


def parse_duration(value: str) -> float:
    """A compose duration such as 120s, 2m or 1m30s, in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"bad duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


# --- who is who --------------------------------------------------------------------------------


def k8s_running(subcommand: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The one workload and container whose main command is ``voicehost <subcommand>``."""
    found = [
        (doc, c)
        for doc in workloads()
        for c in containers(doc)
        if [a[:1] for a in voicehost_argvs(main_argv(c))] == [[subcommand]]
    ]
    assert len(found) == 1, f"want one k8s container running voicehost {subcommand}"
    return found[0]


def compose_running(subcommand: str) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose()["services"].items()
        if any(a[:1] == [subcommand] for a in voicehost_argvs(compose_argv(service.get("command"))))
    }


def k8s_env(container: dict[str, Any]) -> dict[str, Any]:
    """A container's environment: ConfigMap keys (envFrom), then its env entries."""
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        assert "configMapRef" in source, "envFrom a Secret would hide its names from this test"
        data = k8s_find("ConfigMap", source["configMapRef"]["name"]).get("data", {})
        env.update({source.get("prefix", "") + key: value for key, value in data.items()})
    for entry in container.get("env", []):
        env[entry["name"]] = entry.get("value", entry.get("valueFrom"))
    return env


def compose_env(service: dict[str, Any]) -> dict[str, Any]:
    environment = service.get("environment", {})
    if isinstance(environment, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in environment)
    return dict(environment)


def listen_port(env: dict[str, Any]) -> int:
    return int(env.get("VOICEHOST_PORT", Settings.model_fields["port"].default))


def container_port(container: dict[str, Any], port: int | str) -> int:
    for entry in container.get("ports", []):
        if port in (entry.get("name"), entry["containerPort"]):
            return entry["containerPort"]
    raise AssertionError(f"{container['name']} has no port {port!r}")


def compose_mounts(service: dict[str, Any]) -> dict[str, str]:
    """target path -> volume, from the short (``source:target[:mode]``) or the long syntax."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        mounts[target] = source
    return mounts


def env_sources() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in workloads():
        for container in containers(doc):
            yield f"k8s {doc['metadata']['name']}/{container['name']}", k8s_env(container)
    for name, service in compose()["services"].items():
        yield f"compose {name}", compose_env(service)
    for path in sorted(DEPLOY.glob("*.Dockerfile")):
        yield path.name, dockerfile_env(path)


# --- the tests ---------------------------------------------------------------------------------


def test_every_yaml_file_parses_and_every_manifest_is_named():
    assert COMPOSE in yaml_files()
    for path in yaml_files():
        assert load_yaml(path), f"{path} is empty"
    for doc in k8s_docs():
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), doc
        assert doc["metadata"]["name"], doc


def test_kustomization_lists_every_manifest():
    [kustomization] = load_yaml(K8S / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == [p.name for p in k8s_manifests()]


def test_every_environment_variable_is_a_real_setting_or_allowed():
    sources = list(env_sources())
    assert sum(len(env) for _, env in sources) > 10
    wrong = [
        f"{where}: {name}"
        for where, env in sources
        for name in env
        if not (
            name in SETTINGS
            if name.startswith("VOICEHOST_")
            else name in OTHER_ENV or name.startswith(OTHER_ENV_PREFIXES)
        )
    ]
    assert not wrong, "neither a voicehost setting nor allowed:\n" + "\n".join(wrong)


def test_configmap_values_are_strings_and_env_references_resolve():
    for doc in k8s_docs():
        if doc["kind"] == "ConfigMap":
            for key, value in doc.get("data", {}).items():
                assert isinstance(value, str), f"ConfigMap {doc['metadata']['name']}: {key}"
    for doc in workloads():
        for container in containers(doc):
            own = [entry["name"] for entry in container.get("env", [])]
            defined = set(k8s_env(container)) - set(own)
            for entry in container.get("env", []):
                assert isinstance(entry.get("value", ""), str), entry
                # Kubernetes expands $(NAME) only for names defined before; else it stays as is.
                for ref in re.findall(r"\$\((\w+)\)", entry.get("value", "")):
                    assert ref in defined, f"{container['name']}: {entry['name']} uses $({ref})"
                defined.add(entry["name"])


def test_services_select_pods_and_target_their_ports():
    for service in (d for d in k8s_docs() if d["kind"] == "Service"):
        name, selector = service["metadata"]["name"], service["spec"]["selector"]
        selected = [
            doc
            for doc in workloads()
            if selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, f"Service {name} selects {len(selected)} workloads"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert any(
                target in (p.get("name"), p["containerPort"])
                for c in containers(selected[0])
                for p in c.get("ports", [])
            ), f"Service {name}: no container port {target}"
    for doc in workloads():
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
        if doc["kind"] == "StatefulSet":
            k8s_find("Service", doc["spec"]["serviceName"])


def test_containers_listen_on_all_interfaces():
    for subcommand in ("worker", "gateway"):
        _, container = k8s_running(subcommand)
        assert k8s_env(container).get("VOICEHOST_HOST") == "0.0.0.0", subcommand
        for name, service in compose_running(subcommand).items():
            assert compose_env(service).get("VOICEHOST_HOST") == "0.0.0.0", name
    for path in (WORKER_DOCKERFILE, GATEWAY_DOCKERFILE):
        assert dockerfile_env(path).get("VOICEHOST_HOST") == "0.0.0.0", path.name


def test_the_gateway_publishes_the_udp_ports_its_webrtc_binds_and_announces_an_address():
    """WebRTC ends at the gateway (workers are never reached by clients): every port of its
    ``VOICEHOST_WEBRTC_UDP_PORTS`` is published as UDP, one to one, with an address announced,
    and no more sessions are allowed than it has ports."""

    def port_range(env: dict[str, Any]) -> range:
        first, last = Settings(webrtc_udp_ports=env["VOICEHOST_WEBRTC_UDP_PORTS"]).udp_port_range()
        assert int(env["VOICEHOST_WEBRTC_MAX_SESSIONS"]) <= last - first + 1
        assert env.get("VOICEHOST_WEBRTC_ANNOUNCED_ADDRESS")
        return range(first, last + 1)

    _, container = k8s_running("gateway")
    udp = {
        (p["containerPort"], p.get("hostPort"))
        for p in container["ports"]
        if p.get("protocol") == "UDP"
    }
    assert udp == {(port, port) for port in port_range(k8s_env(container))}
    for name, service in compose_running("gateway").items():
        published = set()
        for entry in service["ports"]:
            if entry.endswith("/udp"):
                host, inside = entry.removesuffix("/udp").split(":")
                assert host == inside, name
                first, last = (int(p) for p in inside.split("-"))
                published |= set(range(first, last + 1))
        assert published == set(port_range(compose_env(service))), name
    _, worker = k8s_running("worker")
    assert not any(p.get("protocol") == "UDP" for p in worker.get("ports", []))


def test_the_worker_requests_a_gpu_and_the_gateway_none():
    _, worker = k8s_running("worker")
    assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) == 1
    _, gateway = k8s_running("gateway")
    assert "nvidia.com/gpu" not in gateway.get("resources", {}).get("limits", {})

    gpus = []
    workers = compose_running("worker")
    assert len(workers) >= 2, "compose runs two workers"
    for name, service in workers.items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        nvidia = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d["capabilities"]]
        assert len(nvidia) == 1, name
        assert len(nvidia[0].get("device_ids", [])) == 1 or nvidia[0].get("count") == 1, name
        gpus += nvidia[0].get("device_ids", [])
    assert len(gpus) == len(set(gpus)), f"two workers share a GPU: {gpus}"


@pytest.mark.parametrize("subcommand", ["worker", "gateway"])
def test_k8s_probes_hit_readyz_and_healthz_on_the_served_port(subcommand: str):
    _, container = k8s_running(subcommand)
    port = listen_port(k8s_env(container))
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        http = container[probe]["httpGet"]
        assert http["path"] == path, f"{subcommand} {probe}"
        assert container_port(container, http["port"]) == port, f"{subcommand} {probe}"
    if "startupProbe" in container:
        assert container_port(container, container["startupProbe"]["httpGet"]["port"]) == port


def test_a_loading_worker_is_not_killed_by_its_liveness_probe():
    _, container = k8s_running("worker")
    startup = container.get("startupProbe")
    if startup:
        budget = startup.get("initialDelaySeconds", 0)
        budget += startup.get("failureThreshold", 3) * startup.get("periodSeconds", 10)
    else:
        budget = container["livenessProbe"].get("initialDelaySeconds", 0)
    assert budget >= 300, f"only {budget} s for the model to load"


def test_the_k8s_worker_drains_within_its_grace_period():
    doc, container = k8s_running("worker")
    [drain] = voicehost_argvs(container["lifecycle"]["preStop"]["exec"]["command"])
    assert drain[:1] == ["drain"]
    url = urlsplit(option(drain, "--url"))
    assert url.hostname in {"127.0.0.1", "localhost"}
    assert url.port == listen_port(k8s_env(container))
    timeout = float(option(drain, "--timeout"))
    grace = pod_spec(doc)["terminationGracePeriodSeconds"]
    assert timeout + 10 <= grace, f"drain {timeout} s, grace period {grace} s"


def test_compose_workers_drain_on_stop_within_the_grace_period():
    for name, service in compose_running("worker").items():
        drains = [a for a in voicehost_argvs(compose_argv(service["command"])) if a[0] == "drain"]
        assert len(drains) == 1, f"{name} does not drain on stop"
        assert urlsplit(option(drains[0], "--url")).port == listen_port(compose_env(service))
        timeout = float(option(drains[0], "--timeout"))
        grace = parse_duration(service["stop_grace_period"])
        assert timeout + 10 <= grace, f"{name}: drain {timeout} s, stop_grace_period {grace} s"


def test_workers_have_stable_ids_and_reachable_advertise_urls():
    doc, container = k8s_running("worker")
    assert doc["kind"] == "StatefulSet"
    headless = k8s_find("Service", doc["spec"]["serviceName"])
    assert headless["spec"].get("clusterIP") == "None"
    env = {e["name"]: e for e in container["env"]}
    field = {
        name: e["valueFrom"]["fieldRef"]["fieldPath"]
        for name, e in env.items()
        if "fieldRef" in e.get("valueFrom", {})
    }
    pod_name = {name for name, path in field.items() if path == "metadata.name"}
    worker_id = env["VOICEHOST_WORKER_ID"].get("value")
    assert "VOICEHOST_WORKER_ID" in pod_name or worker_id in {f"$({n})" for n in pod_name}
    advertise = env["VOICEHOST_ADVERTISE_URL"]["value"]
    url = urlsplit(advertise)
    # The host as written ($(POD_NAME).<headless service>...); urlsplit's hostname lower-cases it.
    host = re.fullmatch(r"\$\((\w+)\)(\.[\w.$()-]+)?", url.netloc.rsplit(":", 1)[0])
    assert host, f"advertise URL {advertise}"
    if host.group(1) in pod_name:
        assert (host.group(2) or "").startswith(f".{headless['metadata']['name']}."), advertise
    else:
        assert field.get(host.group(1)) == "status.podIP" and not host.group(2), advertise
    assert url.port == listen_port(k8s_env(container))

    ids = []
    for name, service in compose_running("worker").items():
        env = compose_env(service)
        ids.append(env["VOICEHOST_WORKER_ID"])
        url = urlsplit(env["VOICEHOST_ADVERTISE_URL"])
        assert url.hostname in {name, service.get("hostname")}, name
        assert url.port == listen_port(env), name
    assert len(ids) == len(set(ids)), f"worker ids collide: {ids}"


def test_gateways_and_workers_share_one_read_write_many_volume():
    for subcommand in ("worker", "gateway"):
        doc, container = k8s_running(subcommand)
        shared_dir = k8s_env(container)["VOICEHOST_SHARED_DIR"]
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == shared_dir]
        [volume] = [v for v in pod_spec(doc)["volumes"] if v["name"] == mount["name"]]
        claim = k8s_find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
        assert "ReadWriteMany" in claim["spec"]["accessModes"], subcommand
    gateways, _ = k8s_running("gateway")
    assert gateways["kind"] == "Deployment" and gateways["spec"]["replicas"] >= 2

    volumes = set()
    for name, service in {**compose_running("worker"), **compose_running("gateway")}.items():
        shared_dir = compose_env(service)["VOICEHOST_SHARED_DIR"]
        assert compose_mounts(service).get(shared_dir), f"{name} does not mount {shared_dir}"
        volumes.add(compose_mounts(service)[shared_dir])
    assert len(volumes) == 1 and volumes <= set(compose()["volumes"]), volumes


def test_redis_persists_the_registry():
    [redis] = [s for s in compose()["services"].values() if s["image"].startswith("redis")]
    command = redis["command"] if isinstance(redis["command"], list) else redis["command"].split()
    assert option(command, "--appendonly") == "yes"
    assert "/data" in compose_mounts(redis)

    [(doc, container)] = [
        (d, c) for d in workloads() for c in containers(d) if c["image"].startswith("redis")
    ]
    assert option(main_argv(container), "--appendonly") == "yes"
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/data"]
    claims = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
    claims |= {v["name"] for v in pod_spec(doc).get("volumes", []) if "persistentVolumeClaim" in v}
    assert mount["name"] in claims


def check_image(path: Path, subcommand: str) -> None:
    instructions = dockerfile(path)
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}, f"{path.name} runs as root"
    exposed = " ".join(rest for word, rest in instructions if word == "EXPOSE").split()
    assert str(listen_port(dockerfile_env(path))) in exposed, path.name
    [health] = [rest for word, rest in instructions if word == "HEALTHCHECK"]
    assert "/healthz" in " ".join(healthcheck_argv(health)), path.name
    cmd = [rest for word, rest in instructions if word == "CMD"][-1]
    assert voicehost_argvs(dockerfile_argv(cmd)) == [[subcommand]], path.name


def check_locked_install(path: Path, engine: str) -> None:
    """The image installs what `make serve` does: pinned by the engine's lock (copied into the
    build context), the speaker embedder at the Makefile's pin, and no test extra."""
    instructions = dockerfile(path)
    lock = f"locks/{engine}.txt"
    copies = " ".join(rest for word, rest in instructions if word == "COPY")
    assert lock in copies, f"{path.name} does not copy {lock}"
    ignore = Path(f"{path}.dockerignore").read_text().splitlines()
    assert f"!{lock}" in ignore, f"{path.name}'s build context leaves out {lock}"
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    installs = [part for part in runs.split("&&") if "pip install" in part and "-r " in part]
    assert installs and all(f"-c {lock}" in part for part in installs), path.name
    makefile = (DEPLOY.parent / "Makefile").read_text()
    [resemblyzer] = re.findall(r"^RESEMBLYZER := (\S+)$", makefile, re.MULTILINE)
    assert f'"{resemblyzer}"' in runs, f"{path.name} does not install {resemblyzer}"
    assert "[test]" not in runs and ",test]" not in runs


def test_the_worker_image_runs_the_gpu_build_as_a_user():
    assert base_image(WORKER_DOCKERFILE).startswith(("nvidia/cuda:", "vllm/vllm-openai"))
    runs = " ".join(rest for word, rest in dockerfile(WORKER_DOCKERFILE) if word == "RUN")
    assert "python3.11" in runs and '".[gpu]"' in runs
    check_locked_install(WORKER_DOCKERFILE, "gpu")
    check_image(WORKER_DOCKERFILE, "worker")


def test_the_gateway_image_is_slim_python_without_the_engine():
    assert base_image(GATEWAY_DOCKERFILE) == "python:3.11-slim"
    runs = " ".join(rest for word, rest in dockerfile(GATEWAY_DOCKERFILE) if word == "RUN")
    assert "[gpu]" not in runs and "vllm" not in runs
    check_locked_install(GATEWAY_DOCKERFILE, "cpu")
    check_image(GATEWAY_DOCKERFILE, "gateway")


CALLS = voicehost_calls()


def test_the_cluster_commands_are_all_found():
    assert {"worker", "gateway", "drain"} <= {call.argv[0] for call in CALLS if call.argv}


@pytest.mark.parametrize("call", CALLS, ids=str)
def test_every_voicehost_command_line_parses(call: Call):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            build_parser().parse_args(list(call.argv))
    except SystemExit as exc:
        pytest.fail(f"{call}\n{stderr.getvalue() or exc}", pytrace=False)
