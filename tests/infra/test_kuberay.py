"""KubeRay manifests and the MLflow server manifests: kinds, required fields, known fields only, GPU scheduling,
image/Ray versions, and RayJob entrypoints that run real job files with flags those jobs accept.

The structural checker lives in _infra_checks.py (documented there: no PyPI package ships the CRD schemas).
"""
from __future__ import annotations

import copy
import re

import pytest
import ray
import yaml
from _infra_checks import (
    INFRA,
    K8S_YAMLS,
    KUBERAY_YAMLS,
    REPO,
    all_images,
    check_kuberay,
    job_rejects,
    load_all,
    ray_version_of_image,
    split_entrypoint,
)

KUBERAY_DOCS = [(p.name, d) for p in KUBERAY_YAMLS for d in load_all(p) if d.get("apiVersion") == "ray.io/v1"]
RAYJOBS = {p.name: d for p, ds in ((p, load_all(p)) for p in KUBERAY_YAMLS) for d in ds if d.get("kind") == "RayJob"}


def test_the_manifests_we_promise_exist():
    names = {p.name for p in KUBERAY_YAMLS}
    assert {"raycluster.yaml", "rayjob-build-dataset.yaml", "rayjob-pretrain.yaml", "shared-storage.yaml",
            "security.yaml"} <= names
    assert (INFRA / "mlflow" / "mlflow.yaml").is_file()


@pytest.mark.parametrize("name,doc", KUBERAY_DOCS, ids=[n for n, _ in KUBERAY_DOCS])
def test_kuberay_structure(name, doc):
    assert check_kuberay(doc) == []


@pytest.mark.parametrize("name,doc", KUBERAY_DOCS, ids=[n for n, _ in KUBERAY_DOCS])
def test_kuberay_versions(name, doc):
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    assert spec["rayVersion"] == ray.__version__
    images = all_images(doc)
    assert images and all(ray_version_of_image(i) == ray.__version__ for i in images), images


def _cluster_spec(doc):
    return doc["spec"].get("rayClusterSpec", doc["spec"])


@pytest.mark.parametrize(
    "mutate,expect",
    [
        (lambda s: s.pop("headGroupSpec"), "headGroupSpec is required"),
        (lambda s: s.__setitem__("workerGroupSpec", s.pop("workerGroupSpecs")), "unknown field 'workerGroupSpec'"),
        (lambda s: s["headGroupSpec"]["rayStartParams"].__setitem__("num-cpus", 0), "must be a string"),
        (lambda s: s["workerGroupSpecs"][0]["template"]["spec"].pop("tolerations"), "toleration"),
        (lambda s: s["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"].pop("limits"),
         "resources.limits"),
        (lambda s: s["headGroupSpec"]["template"]["spec"]["containers"][0]["env"].append(
            {"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}), "literal value"),
        (lambda s: s["workerGroupSpecs"][0].__setitem__("replicas", 9), "minReplicas <= replicas <= maxReplicas"),
    ],
    ids=["no-head", "typo", "int-param", "gpu-no-toleration", "no-limits", "literal-secret", "replicas"],
)
def test_the_checker_catches_mistakes(mutate, expect):
    doc = copy.deepcopy(next(d for n, d in KUBERAY_DOCS if n == "raycluster.yaml"))
    gpu_first = sorted(_cluster_spec(doc)["workerGroupSpecs"], key=lambda g: "gpu" not in g["groupName"])
    _cluster_spec(doc)["workerGroupSpecs"] = gpu_first
    mutate(_cluster_spec(doc))
    assert any(expect in e for e in check_kuberay(doc)), check_kuberay(doc)


def test_raycluster_has_cpu_and_gpu_groups():
    doc = next(d for n, d in KUBERAY_DOCS if n == "raycluster.yaml")
    groups = {g["groupName"]: g for g in doc["spec"]["workerGroupSpecs"]}
    gpu = [g for g in groups.values()
           if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]]
    assert gpu and len(gpu) < len(groups)
    assert doc["spec"]["enableInTreeAutoscaling"] is True


@pytest.mark.parametrize("name,job", [("rayjob-build-dataset.yaml", "build_dataset"),
                                      ("rayjob-pretrain.yaml", "pretrain")])
def test_rayjob_entrypoints_run_real_jobs_with_accepted_flags(name, job):
    cmd = RAYJOBS[name]["spec"]["entrypoint"]
    stem, args = split_entrypoint(cmd)
    assert stem == job
    assert (REPO / "jobs" / f"{job}.py").is_file(), f"jobs/{job}.py does not exist"
    assert job_rejects(job, args) is None
    # The working dir the entrypoint's relative path needs: the project as installed in the image.
    assert yaml.safe_load(RAYJOBS[name]["spec"]["runtimeEnvYAML"])["working_dir"] == "/home/ray/bert-pretrain"
    assert "WORKDIR /home/ray/bert-pretrain" in (INFRA / "docker" / "Dockerfile").read_text()


def _normalise(cmd: str) -> str:
    return " ".join(cmd.split())


def _code_blocks(doc: str) -> list[str]:
    text = (REPO / doc).read_text()
    return [_normalise(b.replace("\\\n", " ")) for b in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)]


@pytest.mark.parametrize("name", ["rayjob-build-dataset.yaml", "rayjob-pretrain.yaml"])
def test_rayjob_entrypoints_are_the_documented_commands(name):
    """The RayJob runs exactly the command a user reads in docs/scaling.md (code blocks; continuations joined)."""
    cmd = _normalise(RAYJOBS[name]["spec"]["entrypoint"])
    assert any(cmd in b for b in _code_blocks("docs/scaling.md")), f"docs/scaling.md has no code block with:\n{cmd}"


@pytest.mark.parametrize("name", ["rayjob-build-dataset.yaml", "rayjob-pretrain.yaml"])
def test_rayjob_entrypoints_are_the_readme_commands(name):
    cmd = _normalise(RAYJOBS[name]["spec"]["entrypoint"])
    assert any(cmd in b for b in _code_blocks("README.md")), f"README.md has no code block with:\n{cmd}"


# --- plain Kubernetes objects (the MLflow server) -----------------------------------------------------------

K8S_KINDS = {("v1", "Namespace"), ("v1", "Service"), ("v1", "PersistentVolumeClaim"), ("apps/v1", "Deployment"),
             ("apps/v1", "StatefulSet"), ("v1", "ServiceAccount"), ("v1", "ConfigMap"),
             ("networking.k8s.io/v1", "NetworkPolicy"),
             ("ray.io/v1", "RayCluster"), ("ray.io/v1", "RayJob")}


@pytest.mark.parametrize("path", K8S_YAMLS, ids=[p.name for p in K8S_YAMLS])
def test_every_k8s_object_has_a_known_kind_and_a_name(path):
    for doc in load_all(path):
        assert (doc.get("apiVersion"), doc.get("kind")) in K8S_KINDS, (path.name, doc.get("kind"))
        assert doc["metadata"]["name"]
        assert doc.get("kind") != "Secret", "secrets are created with kubectl from the shell, never committed"


def test_mlflow_server_manifest():
    docs = load_all(INFRA / "mlflow" / "mlflow.yaml")
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    workloads = by_kind["Deployment"] + by_kind["StatefulSet"]
    for w in workloads:
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for c in w["spec"]["template"]["spec"]["containers"]:
            assert c["resources"]["requests"] and c["resources"]["limits"]
            for e in c.get("env", []):
                if re.search("PASSWORD|SECRET|KEY", e["name"]):
                    assert "secretKeyRef" in e.get("valueFrom", {}), e
    all_labels = [w["spec"]["template"]["metadata"]["labels"] for w in workloads]
    for svc in by_kind["Service"]:
        assert any(svc["spec"]["selector"].items() <= lab.items() for lab in all_labels), svc["metadata"]["name"]
    server = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "mlflow")
    env = {e["name"]: e for e in server["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["value"].startswith("postgresql://")
    assert "$(POSTGRES_PASSWORD)" in env["MLFLOW_BACKEND_STORE_URI"]["value"]
    assert env["MLFLOW_ARTIFACTS_DESTINATION"]["value"].startswith("s3://")
    # What the jobs are pointed at must be this service.
    svc = next(s for s in by_kind["Service"] if s["metadata"]["name"] == "mlflow")
    uri = f"http://mlflow.{svc['metadata']['namespace']}.svc.cluster.local:{svc['spec']['ports'][0]['port']}"
    for _, doc in KUBERAY_DOCS:
        assert uri in yaml.safe_dump(doc), "MLFLOW_TRACKING_URI in the KubeRay manifests names the MLflow service"


def _claims(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["persistentVolumeClaim"]["claimName"]} if "persistentVolumeClaim" in node else set()
        return found.union(*(_claims(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_claims(v) for v in node))
    return set()


def test_volumes_exist_and_exports_live_on_them():
    """Every claim a pod mounts is defined here; --export/--init paths are on the shared mount that all pods see."""
    defined = {d["metadata"]["name"] for p in KUBERAY_YAMLS for d in load_all(p)
               if d["kind"] == "PersistentVolumeClaim"}
    for _, doc in KUBERAY_DOCS:
        assert _claims(doc) <= defined
    cmd = RAYJOBS["rayjob-pretrain.yaml"]["spec"]["entrypoint"].split()
    export = cmd[cmd.index("--export") + 1]
    assert export.startswith("/mnt/shared/")
    spec = RAYJOBS["rayjob-pretrain.yaml"]["spec"]["rayClusterSpec"]
    for tpl in [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]:
        mounts = tpl["spec"]["containers"][0].get("volumeMounts", [])
        assert any(m["mountPath"] == "/mnt/shared" for m in mounts)
