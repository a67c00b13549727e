"""deploy/helm/cascade rendered by Helm's own Go SDK (helm-python-sdk: libhelm_c over Helm v4,
no helm binary, no cluster), for the default values and deploy/helm/values-gpu-pool.yaml; every
manifest validated against the Kubernetes OpenAPI schemas of one pinned Kubernetes version
(kubernetes-validate's bundled schemas, strict: unknown fields fail). Then the fields the chart
exists for are asserted on the rendered objects: the reward-worker HPA, GPU scheduling, the
sandbox's security context, probes, and that every container runs a real command of the project.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from deploy_checks import DEPLOY, EntryPointPending, check_argv

from cascade.config import parse_cascade_yaml
from services.api.settings import ApiSettings

CHART = DEPLOY / "helm" / "cascade"
KUBERNETES_VERSION = "1.33.0"  # user namespaces on by default; appArmorProfile and grpc probes GA
RELEASE = "cascade"
VALUES_FILES = {"default": None, "gpu-pool": DEPLOY / "helm" / "values-gpu-pool.yaml"}
GPU_WORKLOADS = ("rollout", "teacher", "learner")
Manifest = dict[str, Any]


@cache
def values(which: str) -> dict[str, Any]:
    path = VALUES_FILES[which]
    with helm.Chart.load(CHART) as chart:
        overrides = helm.values_from_yaml(path.read_text()) if path else {}
        return chart.merge_values(overrides)


@cache
def render(which: str) -> tuple[Manifest, ...]:
    path = VALUES_FILES[which]
    with helm.Chart.load(CHART) as chart:
        overrides = helm.values_from_yaml(path.read_text()) if path else {}
        rendered = chart.render(overrides, name=RELEASE, namespace="ml", is_install=True)
    docs = [
        doc
        for name, text in sorted(rendered.items())
        if name.endswith((".yaml", ".yml"))
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return tuple(docs)


def find(which: str, kind: str, name: str) -> Manifest:
    matches = [d for d in render(which) if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{which}: {kind}/{name}: {len(matches)} rendered"
    return matches[0]


def workload(which: str, component: str) -> Manifest:
    """The component's Deployment, or StatefulSet (the sharded learner)."""
    matches = [
        d
        for d in render(which)
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == f"{RELEASE}-{component}"
    ]
    assert len(matches) == 1, f"{which}: {component}: {len(matches)} workloads rendered"
    return matches[0]


def pod_spec(which: str, component: str) -> dict[str, Any]:
    spec: dict[str, Any] = workload(which, component)["spec"]["template"]["spec"]
    return spec


def gpus_per_pod(v: dict[str, Any], component: str) -> int:
    count: int = v[component]["gpusPerNode" if component == "learner" else "gpus"]
    return count


def containers(which: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in render(which):
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                yield f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}", c


def container_argv(c: dict[str, Any]) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


WHICH = list(VALUES_FILES)


@pytest.mark.parametrize("which", WHICH)
def test_every_manifest_validates(which: str) -> None:
    docs = render(which)
    assert docs
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(map(str, err.path))
            pytest.fail(f"{which}: {doc['kind']}/{doc['metadata']['name']}: {where}: {err.message}")


def test_validation_has_teeth() -> None:
    deployment = dict(find("default", "Deployment", f"{RELEASE}-reward-worker"))
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["hostUser"] = False  # typo of hostUsers
    with pytest.raises(kubernetes_validate.ValidationError, match="hostUser"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("which", WHICH)
def test_chart_lints_clean(which: str) -> None:
    path = VALUES_FILES[which]
    overrides = helm.values_from_yaml(path.read_text()) if path else None
    report = helm.lint(CHART, overrides, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


@pytest.mark.parametrize("which", WHICH)
def test_the_whole_system_renders(which: str) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render(which)}
    for component in ("api", "reward", "reward-worker", "rollout", "rollout-worker", "teacher"):
        assert ("Deployment", f"{RELEASE}-{component}") in kinds, component
    # One learner pod: a Deployment; gpu-pool's 2 x 8 GPUs: a StatefulSet (test_learner_ranks.py)
    learner_kind = "StatefulSet" if which == "gpu-pool" else "Deployment"
    assert (learner_kind, f"{RELEASE}-learner") in kinds
    for component in ("api", "reward", "rollout", "teacher"):
        assert ("Service", f"{RELEASE}-{component}") in kinds, component
    for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"):
        assert (kind, f"{RELEASE}-reward-worker") in kinds
    assert ("ConfigMap", f"{RELEASE}-config") in kinds
    assert ("PersistentVolumeClaim", f"{RELEASE}-checkpoints") in kinds
    bundled = which == "default"
    for component in ("postgresql", "redis"):
        assert (("StatefulSet", f"{RELEASE}-{component}") in kinds) == bundled
    assert (("Secret", f"{RELEASE}-secrets") in kinds) == bundled  # gpu-pool: an existing Secret


@pytest.mark.parametrize("which", WHICH)
def test_reward_worker_autoscaling(which: str) -> None:
    v = values(which)["rewardWorker"]
    hpa = find(which, "HorizontalPodAutoscaler", f"{RELEASE}-reward-worker")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": f"{RELEASE}-reward-worker",
    }
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (
        v["autoscaling"]["minReplicas"],
        v["autoscaling"]["maxReplicas"],
    )
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]
    by_type = {m["type"]: m for m in hpa["metrics"]}
    cpu = by_type["Resource"]["resource"]
    assert cpu["name"] == "cpu"
    assert cpu["target"] == {
        "type": "Utilization",
        "averageUtilization": v["autoscaling"]["targetCPUUtilizationPercentage"],
    }
    # Utilization is relative to requests: the worker must request CPU.
    assert pod_spec(which, "reward-worker")["containers"][0]["resources"]["requests"]["cpu"]
    # The HPA owns the replica count.
    assert "replicas" not in find(which, "Deployment", f"{RELEASE}-reward-worker")["spec"]
    if which == "gpu-pool":
        external = by_type["External"]["external"]
        assert external["metric"] == {
            "name": "redis_key_size",
            "selector": {"matchLabels": {"key": "cascade-reward"}},
        }
        assert external["target"] == {"type": "AverageValue", "averageValue": "16"}
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (4, 64)
    else:
        assert "External" not in by_type  # needs a metrics adapter: opt-in


@pytest.mark.parametrize("which", WHICH)
def test_reward_pool_disruption_budget(which: str) -> None:
    pdb = find(which, "PodDisruptionBudget", f"{RELEASE}-reward-worker")["spec"]
    labels = find(which, "Deployment", f"{RELEASE}-reward-worker")["spec"]["template"]["metadata"]["labels"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["maxUnavailable"] == values(which)["rewardWorker"]["pdb"]["maxUnavailable"]


@pytest.mark.parametrize("which", WHICH)
def test_gpu_scheduling(which: str) -> None:
    v = values(which)
    gpu = v["gpu"]["resourceName"]
    assert gpu == "nvidia.com/gpu"
    for component in GPU_WORKLOADS:
        spec = pod_spec(which, component)
        count = gpus_per_pod(v, component)
        resources = spec["containers"][0]["resources"]
        assert resources["limits"][gpu] == resources["requests"][gpu] == count > 0, component
        expected_selector = v[component]["nodeSelector"] or v["gpu"]["nodeSelector"]
        assert spec.get("nodeSelector", {}) == expected_selector, component
        assert {"key": gpu, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"], component
        argv = container_argv(spec["containers"][0])
        if "--device" in argv:
            assert argv[argv.index("--device") + 1] == "cuda", component
    if which == "gpu-pool":
        assert pod_spec(which, "rollout")["nodeSelector"] == {
            "cascade.dev/pool": "rollout",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        }
        for component in ("teacher", "learner"):
            assert pod_spec(which, component)["nodeSelector"] == {"cascade.dev/pool": "train"}
        assert pod_spec(which, "reward-worker")["nodeSelector"] == {"cascade.dev/pool": "sandbox"}
    for name, c in containers(which):
        if not any(f"{RELEASE}-{w}/" in name for w in GPU_WORKLOADS):
            for section in ("requests", "limits"):
                assert gpu not in c.get("resources", {}).get(section, {}), f"{name} asks for a GPU"


@pytest.mark.parametrize("which", WHICH)
def test_sandbox_security_context(which: str) -> None:
    spec = pod_spec(which, "reward-worker")
    pod, ctr = spec["securityContext"], spec["containers"][0]["securityContext"]
    assert pod["seccompProfile"] == {"type": "Unconfined"}
    assert pod["appArmorProfile"] == {"type": "Unconfined"}
    assert ctr["procMount"] == "Unmasked"
    # The API server refuses procMount Unmasked unless the pod has its own user namespace; the
    # schema cannot say so (it is a cross-field rule), so it is checked here.
    assert spec["hostUsers"] is False
    assert (
        pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    )  # the sandbox uid; bwrap as root is no sandbox
    assert ctr["privileged"] is False and ctr["allowPrivilegeEscalation"] is False
    assert ctr["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False
    # hostUsers: false means idmapped volume mounts, which NFS-like storage lacks: no PVC by default.
    assert not any("persistentVolumeClaim" in v for v in spec["volumes"])
    # Only the sandbox pool is relaxed.
    for doc in render(which):
        if doc["kind"] not in ("Deployment", "StatefulSet") or doc["metadata"]["name"].endswith(
            "reward-worker"
        ):
            continue
        other = doc["spec"]["template"]["spec"]
        assert other.get("securityContext", {}).get("seccompProfile") == {"type": "RuntimeDefault"}
        assert "hostUsers" not in other
        for c in other["containers"]:
            assert "procMount" not in c.get("securityContext", {})
            assert not c.get("securityContext", {}).get("privileged")


@pytest.mark.parametrize("which", WHICH)
def test_probes(which: str) -> None:
    services = {
        "rollout": "cascade.v1.RolloutService",
        "teacher": "cascade.v1.TeacherService",
        "reward": "cascade.v1.RewardService",
    }
    for component, service in services.items():
        c = pod_spec(which, component)["containers"][0]
        grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
        assert c["readinessProbe"]["grpc"] == {"port": grpc_port, "service": service}, component
        assert c["livenessProbe"]["grpc"]["port"] == grpc_port, component
    api = pod_spec(which, "api")["containers"][0]
    assert api["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    worker = pod_spec(which, "reward-worker")["containers"][0]
    assert worker["startupProbe"]["exec"]["command"] == ["cascade", "sandbox", "check"]
    assert worker["livenessProbe"]["exec"]["command"] == ["cascade", "sandbox", "check"]
    learner = pod_spec(which, "learner")["containers"][0]  # a restarted pod goes on from its run
    assert "--resume" in container_argv(learner)
    rollout_worker = pod_spec(which, "rollout-worker")["containers"][0]  # no port: its heartbeat file
    health_file = rollout_worker["args"][rollout_worker["args"].index("--health-file") + 1]
    assert rollout_worker["livenessProbe"]["exec"]["command"][2:4] == ["file", health_file]


def _commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for which in WHICH:
        for name, c in containers(which):
            if "postgresql/" in name or "redis/" in name:
                continue
            found.append((which, name, container_argv(c)))
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if "exec" in c.get(probe, {}):
                    found.append((which, f"{name}/{probe}", c[probe]["exec"]["command"]))
    return found


COMMANDS = _commands()


@pytest.mark.parametrize(("which", "name", "argv"), COMMANDS, ids=[f"{w}:{n}" for w, n, _ in COMMANDS])
def test_container_runs_a_real_command(which: str, name: str, argv: list[str]) -> None:
    try:
        problems = check_argv(argv)
    except EntryPointPending as pending:
        pytest.xfail(str(pending))
    assert not problems, f"{which}: {name}: {problems}"


@pytest.mark.parametrize("which", WHICH)
def test_addresses_and_secrets_resolve(which: str) -> None:
    services = {
        d["metadata"]["name"]: {p["port"] for p in d["spec"]["ports"]}
        for d in render(which)
        if d["kind"] == "Service"
    }
    secret_name = values(which)["secrets"]["existingSecret"] or f"{RELEASE}-secrets"
    secret_keys: set[str] | None = None
    if which == "default":
        secret_keys = set(find(which, "Secret", secret_name)["data"])
    for name, c in containers(which):
        for token in c.get("args", []):
            if token.startswith(f"{RELEASE}-") and ":" in token:
                host, port = token.split(":")
                assert host in services and int(port) in services[host], f"{name}: {token}"
        for env in c.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == secret_name, name
                if secret_keys is not None:
                    assert ref["key"] in secret_keys, f"{name}: {ref['key']}"


@pytest.mark.parametrize("which", WHICH)
def test_configmap_holds_valid_configs(which: str) -> None:
    data = find(which, "ConfigMap", f"{RELEASE}-config")["data"]
    cfg = parse_cascade_yaml(data["cascade.yaml"], "cascade.yaml")
    rollout = container_argv(pod_spec(which, "rollout")["containers"][0])
    worker = container_argv(pod_spec(which, "rollout-worker")["containers"][0])
    assert (
        str(cfg.model.path)
        == rollout[rollout.index("--model") + 1]
        == worker[worker.index("--tokenizer") + 1]
    )
    assert str(cfg.output_dir).startswith("/checkpoints/")
    settings = ApiSettings.model_validate(yaml.safe_load(data["api.yaml"]))
    api_env = {e["name"] for e in pod_spec(which, "api")["containers"][0]["env"]}
    assert {t.name for t in settings.tokens} == {t["name"] for t in values(which)["api"]["tokens"]}
    assert {t.token_env for t in settings.tokens} <= api_env
    assert "CASCADE_API_DB_URL" in api_env


@pytest.mark.parametrize("which", WHICH)
def test_shared_checkpoint_volume(which: str) -> None:
    pvc = find(which, "PersistentVolumeClaim", f"{RELEASE}-checkpoints")["spec"]
    assert pvc["accessModes"] == ["ReadWriteMany"]
    for component, read_only in (("learner", False), ("rollout", True), ("teacher", True)):
        spec = pod_spec(which, component)
        claim = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in spec["volumes"]}
        assert claim["checkpoints"] == f"{RELEASE}-checkpoints", component
        mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
        assert mounts["/checkpoints"]["readOnly"] is read_only, component
        assert mounts["/models"]["readOnly"] is True, component


@pytest.mark.parametrize("which", WHICH)
def test_weights_go_to_every_rollout_replica(which: str) -> None:
    """`rollout.replicaCount` pods behind a headless Service (its DNS name lists every ready pod):
    the learner pushes weights to all it resolves, the workers spread requests over them."""
    deployment = find(which, "Deployment", f"{RELEASE}-rollout")["spec"]
    assert deployment["replicas"] == values(which)["rollout"]["replicaCount"]
    headless = find(which, "Service", f"{RELEASE}-rollout-pods")["spec"]
    assert headless["clusterIP"] == "None" and not headless["publishNotReadyAddresses"]
    assert headless["selector"] == deployment["selector"]["matchLabels"]
    for component in ("learner", "rollout-worker"):
        argv = container_argv(pod_spec(which, component)["containers"][0])
        assert "--rollout" not in argv, component
        dns = argv[argv.index("--rollout-dns") + 1]
        assert dns == f"{RELEASE}-rollout-pods:{values(which)['rollout']['port']}", component
    if which == "gpu-pool":
        assert deployment["replicas"] > 1


def test_render_refuses_inconsistent_values() -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match="tensorParallelSize"):
        chart.render({"rollout": {"engine": "vllm", "gpus": 1, "tensorParallelSize": 2}}, name=RELEASE)


def test_external_database_is_required_without_the_bundled_one() -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match=r"externalDatabase\.url"):
        chart.render({"postgresql": {"bundled": False}}, name=RELEASE, namespace="ml")
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(
            {"postgresql": {"bundled": False}, "externalDatabase": {"url": "postgresql://u:p@db:5432/c"}},
            name=RELEASE,
            namespace="ml",
        )
    assert "kind: StatefulSet\nmetadata:\n  name: cascade-postgresql" not in "".join(rendered.values())


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ({"rollout": {"engine": "trt"}}, "/rollout/engine"),
        ({"learner": {"gpusPerNode": -1}}, "/learner/gpusPerNode"),
        ({"learner": {"nodes": 0}}, "/learner/nodes"),
        ({"teacher": {"gpus": -1}}, "/teacher/gpus"),
        ({"teacher": {"maxBatchTokens": 0}}, "/teacher/maxBatchTokens"),
        ({"teacher": {"logitsChunkMib": 0}}, "/teacher/logitsChunkMib"),
        ({"rollout": {"replicaCount": 0}}, "/rollout/replicaCount"),
        ({"rewardWorker": {"sandbox": {"runAsUser": 0}}}, "/rewardWorker/sandbox/runAsUser"),
        ({"rewardWorker": {"sandbox": {"procMount": "Default"}}}, "/rewardWorker/sandbox/procMount"),
        ({"rewardFront": {"remoteDomains": "code,chemistry"}}, "/rewardFront/remoteDomains"),
        ({"api": {"tokens": [{"name": "admin", "role": "owner"}]}}, "/api/tokens/0/role"),
    ],
)
def test_values_schema_refuses(overrides: dict[str, Any], where: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError, match=where):
        chart.render(overrides, name=RELEASE, namespace="ml")
