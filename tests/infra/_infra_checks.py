"""Shared helpers for the infra tests: where the files are, versions, and a structural check of KubeRay manifests.

No PyPI package ships the KubeRay CRD schemas (they live in the operator's Helm chart), so `check_kuberay` checks
what the KubeRay API reference (ray.io/v1, operator 1.2+) documents for the fields we use: apiVersion/kind,
required fields, *only known keys* at each level we write (a typo such as `workerGroupSpec` is silently ignored
by `kubectl apply` and gives a cluster without workers), string-valued rayStartParams, container images and
resources, and for GPU groups the toleration and node selector the GPU nodes need.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
CLUSTER_YAMLS = sorted(INFRA.glob("*/cluster.yaml"))
KUBERAY_YAMLS = sorted((INFRA / "kuberay").glob("*.yaml"))
K8S_YAMLS = KUBERAY_YAMLS + sorted((INFRA / "mlflow").glob("*.yaml"))

# Image references that carry our Ray version: the stock image, or ours built FROM it (infra/docker/Dockerfile).
RAY_IMAGE_VERSION = [
    re.compile(r"^rayproject/ray:(\d+\.\d+\.\d+)-py3\d+(?:-[a-z0-9]+)?$"),
    re.compile(r"/bert-pretrain:[\w.]*-ray(\d+\.\d+\.\d+)-py3\d+-(?:cpu|gpu)$"),
]


def load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def ray_version_of_image(image: str) -> str | None:
    for pattern in RAY_IMAGE_VERSION:
        m = pattern.search(image)
        if m:
            return m.group(1)
    return None


def pinned(name: str) -> str:
    """The version constraints.txt pins for `name` (what scripts/_venv.sh and setup_node.sh install)."""
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.lower().startswith(name.lower() + "=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{name} is not pinned in constraints.txt")


# --- KubeRay ------------------------------------------------------------------------------------------------

RAYCLUSTER_SPEC_KEYS = {
    "headGroupSpec", "workerGroupSpecs", "rayVersion", "enableInTreeAutoscaling", "autoscalerOptions",
    "headServiceAnnotations", "suspend", "managedBy", "gcsFaultToleranceOptions",
}
HEAD_GROUP_KEYS = {"template", "headService", "enableIngress", "rayStartParams", "serviceType"}
WORKER_GROUP_KEYS = {
    "groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds", "rayStartParams", "template",
    "scaleStrategy", "suspend", "numOfHosts",
}
RAYJOB_SPEC_KEYS = {
    "entrypoint", "metadata", "runtimeEnvYAML", "jobId", "submissionMode", "entrypointResources",
    "entrypointNumCpus", "entrypointNumGpus", "ttlSecondsAfterFinished", "shutdownAfterJobFinishes", "suspend",
    "rayClusterSpec", "clusterSelector", "submitterPodTemplate", "submitterConfig", "activeDeadlineSeconds",
    "backoffLimit", "managedBy", "deletionStrategy",
}
AUTOSCALER_OPTION_KEYS = {
    "resources", "image", "imagePullPolicy", "securityContext", "idleTimeoutSeconds", "upscalingMode", "version",
    "env", "envFrom", "volumeMounts",
}
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}
SECRET_ENV = re.compile(r"(KEY|SECRET|PASSWORD|TOKEN|CREDENTIAL)", re.I)
GPU = "nvidia.com/gpu"


def _unknown(d: dict, allowed: set[str], where: str) -> list[str]:
    return [f"{where}: unknown field {k!r} (KubeRay ignores it)" for k in sorted(set(d) - allowed)]


def check_pod_template(tpl: dict, where: str, gpu_group: bool) -> list[str]:
    errs: list[str] = []
    spec = (tpl or {}).get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        return [f"{where}: template.spec.containers is empty"]
    for c in containers:
        cw = f"{where}.containers[{c.get('name')}]"
        for k in ("name", "image", "resources"):
            if not c.get(k):
                errs.append(f"{cw}: missing {k}")
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for r in ("cpu", "memory"):
                if r not in (res.get(kind) or {}):
                    errs.append(f"{cw}: resources.{kind}.{r} missing (Ray sizes itself from the limits)")
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if (GPU in req or GPU in lim) and str(req.get(GPU)) != str(lim.get(GPU)):
            errs.append(f"{cw}: {GPU} requests and limits must be equal (extended resource)")
        for e in c.get("env") or []:
            if SECRET_ENV.search(e.get("name", "")) and "value" in e:
                errs.append(f"{cw}: env {e['name']} has a literal value; use valueFrom.secretKeyRef")
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref is not None and not (ref.get("name") and ref.get("key")):
                errs.append(f"{cw}: env {e.get('name')} secretKeyRef needs name and key")
    if gpu_group:
        tolerations = spec.get("tolerations") or []
        if not any(t.get("key") == GPU for t in tolerations):
            errs.append(f"{where}: GPU group without a toleration for {GPU} (GPU nodes are usually tainted)")
        if not spec.get("nodeSelector"):
            errs.append(f"{where}: GPU group without a nodeSelector")
        if not any(GPU in ((c.get("resources") or {}).get("limits") or {}) for c in containers):
            errs.append(f"{where}: GPU group whose containers request no {GPU}")
    return errs


def check_ray_start_params(params, where: str) -> list[str]:
    if params is None:
        return []
    if not isinstance(params, dict):
        return [f"{where}.rayStartParams must be a map"]
    return [f"{where}.rayStartParams.{k} must be a string (got {type(v).__name__})"
            for k, v in params.items() if not isinstance(v, str)]


def check_raycluster_spec(spec: dict, where: str) -> list[str]:
    errs = _unknown(spec, RAYCLUSTER_SPEC_KEYS, where)
    head = spec.get("headGroupSpec")
    if not isinstance(head, dict):
        return errs + [f"{where}: headGroupSpec is required"]
    errs += _unknown(head, HEAD_GROUP_KEYS, f"{where}.headGroupSpec")
    errs += _unknown(spec.get("autoscalerOptions") or {}, AUTOSCALER_OPTION_KEYS, f"{where}.autoscalerOptions")
    errs += check_ray_start_params(head.get("rayStartParams"), f"{where}.headGroupSpec")
    if "template" not in head:
        errs.append(f"{where}.headGroupSpec: template is required")
    else:
        errs += check_pod_template(head["template"], f"{where}.headGroupSpec", gpu_group=False)
    names = set()
    for i, g in enumerate(spec.get("workerGroupSpecs") or []):
        gw = f"{where}.workerGroupSpecs[{g.get('groupName', i)}]"
        errs += _unknown(g, WORKER_GROUP_KEYS, gw)
        if not g.get("groupName"):
            errs.append(f"{gw}: groupName is required")
        if g.get("groupName") in names:
            errs.append(f"{gw}: duplicate groupName")
        names.add(g.get("groupName"))
        lo, n, hi = g.get("minReplicas", 0), g.get("replicas", 0), g.get("maxReplicas", 2**31)
        if not (isinstance(lo, int) and isinstance(hi, int) and lo <= n <= hi):
            errs.append(f"{gw}: need minReplicas <= replicas <= maxReplicas (got {lo}, {n}, {hi})")
        errs += check_ray_start_params(g.get("rayStartParams"), gw)
        if "template" not in g:
            errs.append(f"{gw}: template is required")
            continue
        containers = ((g["template"].get("spec") or {}).get("containers")) or []
        gpu = any(GPU in (((c.get("resources") or {}).get("limits")) or {}) for c in containers) or "gpu" in str(
            g.get("groupName", "")).lower()
        errs += check_pod_template(g["template"], gw, gpu_group=gpu)
    return errs


def check_kuberay(doc: dict) -> list[str]:
    """Errors in one KubeRay object (empty list = fine)."""
    kind, api = doc.get("kind"), doc.get("apiVersion")
    where = f"{kind}/{(doc.get('metadata') or {}).get('name')}"
    if api != "ray.io/v1":
        return [f"{where}: apiVersion must be ray.io/v1 (got {api!r})"]
    errs = [] if (doc.get("metadata") or {}).get("name") else [f"{where}: metadata.name is required"]
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return errs + [f"{where}: spec is required"]
    if kind == "RayCluster":
        return errs + check_raycluster_spec(spec, f"{where}.spec")
    if kind == "RayJob":
        errs += _unknown(spec, RAYJOB_SPEC_KEYS, f"{where}.spec")
        if not isinstance(spec.get("entrypoint"), str) or not spec["entrypoint"].strip():
            errs.append(f"{where}.spec.entrypoint must be a non-empty string")
        if "runtimeEnvYAML" in spec:
            try:
                if not isinstance(yaml.safe_load(spec["runtimeEnvYAML"]), dict):
                    errs.append(f"{where}.spec.runtimeEnvYAML must be a YAML map (a string)")
            except yaml.YAMLError as e:
                errs.append(f"{where}.spec.runtimeEnvYAML is not YAML: {e}")
        if spec.get("submissionMode", "K8sJobMode") not in SUBMISSION_MODES:
            errs.append(f"{where}.spec.submissionMode must be one of {sorted(SUBMISSION_MODES)}")
        if ("rayClusterSpec" in spec) == ("clusterSelector" in spec):
            errs.append(f"{where}.spec: exactly one of rayClusterSpec / clusterSelector")
        if "rayClusterSpec" in spec:
            errs += check_raycluster_spec(spec["rayClusterSpec"], f"{where}.spec.rayClusterSpec")
        return errs
    return errs + [f"{where}: kind must be RayCluster or RayJob"]


def all_images(doc) -> list[str]:
    """Every `image:` value anywhere in a document."""
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in ("image", "head_image", "worker_image") and isinstance(v, str):
                out.append(v)
            else:
                out += all_images(v)
    elif isinstance(doc, list):
        for v in doc:
            out += all_images(v)
    return out


# --- job entrypoints ----------------------------------------------------------------------------------------

def split_entrypoint(cmd: str) -> tuple[str, list[str]]:
    """`python jobs/X.py ARGS` -> ("X", ARGS)."""
    argv = shlex.split(cmd)
    assert argv[0] == "python" and argv[1].startswith("jobs/") and argv[1].endswith(".py"), cmd
    return Path(argv[1]).stem, argv[2:]


def job_rejects(job: str, args: list[str]) -> str | None:
    """None when the job's own argument parser accepts `args`, else why not.

    Uses `jobs.<job>.build_parser()` or `jobs.<job>.parse_args(argv)` (what `main` calls) where the job has one;
    otherwise falls back to the `--help` text (every flag we pass must be listed), weaker but needing nothing.
    """
    import contextlib
    import importlib
    import io

    mod = importlib.import_module(f"jobs.{job}")
    parse = mod.build_parser().parse_args if hasattr(mod, "build_parser") else getattr(mod, "parse_args", None)
    if parse is not None:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parse(args)
        except SystemExit as e:
            return f"jobs/{job}.py's parser rejected {args} (exit {e.code}): {err.getvalue().strip()}"
        return None
    out = subprocess.run([sys.executable, f"jobs/{job}.py", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        return f"jobs/{job}.py --help failed: {out.stderr[-2000:]}"
    listed = set(re.findall(r"--[a-z0-9][a-z0-9-]*", out.stdout))
    missing = [a.split("=")[0] for a in args if a.startswith("--") and a.split("=")[0] not in listed]
    return f"jobs/{job}.py --help does not list {missing}" if missing else None
