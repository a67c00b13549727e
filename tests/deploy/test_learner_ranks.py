"""The learner over several ranks in the Helm chart: `learner.nodes` x `learner.gpusPerNode` > 1
renders a StatefulSet of `nodes` pods running torchrun with a c10d rendezvous on pod 0 (through a
headless Service), each pod requesting `gpusPerNode` GPUs and mounting the shared ReadWriteMany
checkpoint volume; 1 x 1 renders the single `cascade-learner` pod as before. Rendered by Helm's Go
SDK and validated against Kubernetes' schemas as in test_helm_chart.py; the torchrun command line
is parsed by torch's own parser (deploy_checks.check_argv).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from deploy_checks import DEPLOY, check_argv

CHART = DEPLOY / "helm" / "cascade"
KUBERNETES_VERSION = "1.33.0"
RELEASE = "cascade"
NAMESPACE = "ml"
SHARDED = {"learner": {"nodes": 2, "gpusPerNode": 4}, "rollout": {"replicaCount": 3}}
STS = f"{RELEASE}-learner"
RDZV = f"{RELEASE}-learner-rdzv"
Manifest = dict[str, Any]


@cache
def _render(overrides_yaml: str) -> tuple[Manifest, ...]:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(
            yaml.safe_load(overrides_yaml), name=RELEASE, namespace=NAMESPACE, is_install=True
        )
    return tuple(
        doc
        for name, text in sorted(rendered.items())
        if name.endswith((".yaml", ".yml"))
        for doc in yaml.safe_load_all(text)
        if doc
    )


def render(overrides: dict[str, Any]) -> tuple[Manifest, ...]:
    return _render(yaml.safe_dump(overrides, sort_keys=True))


def find(docs: tuple[Manifest, ...], kind: str, name: str) -> Manifest:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} rendered"
    return matches[0]


def learner(docs: tuple[Manifest, ...]) -> Manifest:
    matches = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == STS]
    assert len(matches) == 1
    return matches[0]


def torchrun_options(container: dict[str, Any]) -> Any:
    from torch.distributed.run import get_args_parser

    assert container["command"] == ["torchrun"]
    return get_args_parser().parse_args(container["args"])


def test_sharded_learner_validates_and_lints() -> None:
    docs = render(SHARDED)
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(
                f"{doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, err.path))}: {err.message}"
            )
    report = helm.lint(CHART, SHARDED, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


def test_statefulset_of_nodes_pods_running_torchrun() -> None:
    docs = render(SHARDED)
    sts = learner(docs)
    assert sts["kind"] == "StatefulSet"
    spec = sts["spec"]
    assert spec["replicas"] == 2 and spec["serviceName"] == RDZV
    # All ranks must be up to rendezvous: pods start together. Upgrades replace pods one ordinal
    # at a time, a replacement only once the old pod is gone (no two pods of one ordinal).
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    ns = torchrun_options(c)
    assert (ns.nnodes, ns.nproc_per_node, ns.rdzv_backend) == ("2", "4", "c10d")
    assert ns.rdzv_endpoint == f"{STS}-0.{RDZV}.{NAMESPACE}.svc.cluster.local:29400"  # pod 0's FQDN
    assert ns.rdzv_id == "$(CASCADE_RUN_ID)" and not ns.standalone
    assert ns.module and ns.training_script == "services.learner.main"
    assert not check_argv([*c["command"], *c["args"]])
    # The learner's own arguments are the single-process learner's, unchanged.
    single = learner(render({}))["spec"]["template"]["spec"]["containers"][0]
    assert single["command"] == ["cascade-learner"]
    assert ns.training_script_args == single["args"]
    # The rendezvous id: one per pod template revision, read from the pod's own label.
    env = {e["name"]: e for e in c["env"]}
    assert env["CASCADE_RUN_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['controller-revision-hash']"}
    }
    # No readiness probe: only rank 0's pod serves /health, and updates would wait on the others.
    assert "readinessProbe" not in c
    assert {"name": "rdzv", "containerPort": 29400} in c["ports"]
    assert {"name": "metrics", "containerPort": 9400} in c["ports"]


def test_each_pod_requests_gpus_per_node() -> None:
    (c,) = learner(render(SHARDED))["spec"]["template"]["spec"]["containers"]
    resources = c["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 4
    assert resources["requests"]["cpu"] and resources["limits"]["memory"]  # values' per-pod resources


def test_headless_rendezvous_service() -> None:
    docs = render(SHARDED)
    svc = find(docs, "Service", RDZV)["spec"]
    sts = learner(docs)["spec"]
    assert svc["clusterIP"] == "None"
    # Pods are published before they are ready: the ranks find pod 0 before any of them trains.
    assert svc["publishNotReadyAddresses"] is True
    assert svc["selector"] == sts["selector"]["matchLabels"]
    assert svc["selector"].items() <= sts["template"]["metadata"]["labels"].items()
    assert svc["ports"] == [{"name": "rdzv", "port": 29400, "targetPort": "rdzv"}]


def test_every_pod_writes_the_shared_checkpoint_volume() -> None:
    docs = render(SHARDED)
    pvc = find(docs, "PersistentVolumeClaim", f"{RELEASE}-checkpoints")["spec"]
    assert pvc["accessModes"] == ["ReadWriteMany"]
    pod = learner(docs)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == f"{RELEASE}-checkpoints"
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/checkpoints"]["name"] == "checkpoints" and mounts["/checkpoints"]["readOnly"] is False
    assert mounts["/models"]["readOnly"] is True
    # NCCL's shared memory between the ranks of one pod
    assert mounts["/dev/shm"]["name"] == "dshm" and volumes["dshm"]["emptyDir"]["medium"] == "Memory"


def test_refuses_a_sharded_learner_without_rwx_checkpoints() -> None:
    rwo = {**SHARDED, "checkpoints": {"accessModes": ["ReadWriteOnce"]}}
    with pytest.raises(helm.HelmError, match="ReadWriteMany"):
        render(rwo)
    # One pod may keep a ReadWriteOnce volume; an existing claim is the user's to size.
    assert learner(render({"checkpoints": {"accessModes": ["ReadWriteOnce"]}}))["kind"] == "Deployment"
    existing = {**SHARDED, "checkpoints": {"existingClaim": "mine", "accessModes": ["ReadWriteOnce"]}}
    assert learner(render(existing))["kind"] == "StatefulSet"


def test_the_old_gpus_value_is_refused_by_name() -> None:
    with pytest.raises(helm.HelmError, match="gpusPerNode"):
        render({"learner": {"gpus": 2}})


@pytest.mark.parametrize(
    ("nodes", "gpus", "kind", "nproc"),
    [
        (1, 1, "Deployment", None),
        (1, 0, "Deployment", None),
        (1, 2, "StatefulSet", "2"),
        (3, 0, "StatefulSet", "1"),
    ],
)
def test_one_rank_is_the_single_pod(nodes: int, gpus: int, kind: str, nproc: str | None) -> None:
    docs = render({"learner": {"nodes": nodes, "gpusPerNode": gpus}})
    wl = learner(docs)
    assert wl["kind"] == kind
    (c,) = wl["spec"]["template"]["spec"]["containers"]
    assert c["resources"].get("limits", {}).get("nvidia.com/gpu", 0) == gpus
    if kind == "Deployment":
        assert c["command"] == ["cascade-learner"] and wl["spec"]["strategy"] == {"type": "Recreate"}
        assert not [d for d in docs if d["metadata"]["name"] == RDZV]
    else:
        ns = torchrun_options(c)
        assert (ns.nnodes, ns.nproc_per_node) == (str(nodes), nproc)  # gpusPerNode 0: one CPU rank a pod
        assert wl["spec"]["replicas"] == nodes


def test_rollout_replicas_behind_the_headless_service_with_a_sharded_learner() -> None:
    docs = render(SHARDED)
    rollout = find(docs, "Deployment", f"{RELEASE}-rollout")["spec"]
    assert rollout["replicas"] == 3
    pods = find(docs, "Service", f"{RELEASE}-rollout-pods")["spec"]
    assert pods["clusterIP"] == "None" and pods["selector"] == rollout["selector"]["matchLabels"]
    args = learner(docs)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--rollout-dns") + 1] == f"{RELEASE}-rollout-pods:50052"
