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
    "headServiceAnnotations", "suspend", "managedBy", "gcsFaultToleranceOptions", "authOptions",
}
AUTH_OPTION_KEYS = {"mode", "secretName", "enableK8sTokenAuth"}
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
    errs += _unknown(spec.get("authOptions") or {}, AUTH_OPTION_KEYS, f"{where}.authOptions")
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


# --- security: token auth, pod hardening, services, network policies (docs/security.md) ----------------------

RAY_TOKEN_SECRET_KEY = "auth_token"  # KubeRay's convention for authOptions.secretName Secrets
EXPOSING_SERVICE_TYPES = {"LoadBalancer", "NodePort"}
AWS_KEY_ENV = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}


def cluster_spec_of(doc: dict) -> dict | None:
    """The RayCluster spec inside a RayCluster or a RayJob (None for other kinds)."""
    if doc.get("kind") == "RayCluster":
        return doc.get("spec") or {}
    if doc.get("kind") == "RayJob":
        return (doc.get("spec") or {}).get("rayClusterSpec")
    return None


def ray_pod_templates(doc: dict) -> list[tuple[str, str, dict]]:
    """(where, role, template) for the Ray pods of a RayCluster / RayJob; role is head, worker or submitter."""
    where = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    out: list[tuple[str, str, dict]] = []
    spec = cluster_spec_of(doc)
    if spec:
        out.append((f"{where}.headGroupSpec", "head", (spec.get("headGroupSpec") or {}).get("template") or {}))
        for g in spec.get("workerGroupSpecs") or []:
            out.append((f"{where}.workerGroupSpecs[{g.get('groupName')}]", "worker", g.get("template") or {}))
    if doc.get("kind") == "RayJob" and (doc.get("spec") or {}).get("submitterPodTemplate") is not None:
        out.append((f"{where}.submitterPodTemplate", "submitter", doc["spec"]["submitterPodTemplate"]))
    return out


def pod_templates(doc: dict) -> list[tuple[str, dict]]:
    """(where, template) for every pod any object of ours creates: Ray pods, Deployments, StatefulSets."""
    if doc.get("kind") in ("Deployment", "StatefulSet"):
        return [(f"{doc['kind']}/{doc['metadata']['name']}", (doc.get("spec") or {}).get("template") or {})]
    return [(w, t) for w, _, t in ray_pod_templates(doc)]


def _env(container: dict) -> dict[str, dict]:
    return {e.get("name"): e for e in container.get("env") or []}


def _token_env_errors(env: dict[str, dict], secret: str | None, where: str) -> list[str]:
    errs = []
    if (env.get("RAY_AUTH_MODE") or {}).get("value") != "token":
        errs.append(f"{where}: RAY_AUTH_MODE must be 'token' (Ray's token authentication)")
    ref = ((env.get("RAY_AUTH_TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
    if not ref:
        errs.append(f"{where}: RAY_AUTH_TOKEN must come from a Secret (valueFrom.secretKeyRef)")
    elif secret and (ref.get("name"), ref.get("key")) != (secret, RAY_TOKEN_SECRET_KEY):
        errs.append(f"{where}: RAY_AUTH_TOKEN reads {ref.get('name')}/{ref.get('key')}, "
                    f"authOptions names {secret}/{RAY_TOKEN_SECRET_KEY}")
    return errs


def check_ray_token_auth(doc: dict) -> list[str]:
    """Ray's token auth (RAY_AUTH_MODE=token, the token from a Secret) on the head, every worker, the autoscaler
    sidecar and the RayJob submitter; KubeRay's authOptions naming the same Secret."""
    spec = cluster_spec_of(doc)
    if spec is None:
        return []
    where = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    errs: list[str] = []
    auth = spec.get("authOptions") or {}
    if auth.get("mode") != "token" or not auth.get("secretName"):
        errs.append(f"{where}: authOptions must be {{mode: token, secretName: <Secret>}}")
    secret = auth.get("secretName")
    for tw, _role, tpl in ray_pod_templates(doc):
        containers = ((tpl.get("spec") or {}).get("containers")) or []
        if not containers:
            errs.append(f"{tw}: no containers")
            continue
        # KubeRay's Ray container (and the submitter) is the first one.
        errs += _token_env_errors(_env(containers[0]), secret, f"{tw}.containers[{containers[0].get('name')}]")
    if spec.get("enableInTreeAutoscaling"):
        errs += _token_env_errors(_env(spec.get("autoscalerOptions") or {}), secret, f"{where}.autoscalerOptions")
    if doc.get("kind") == "RayJob" and (doc.get("spec") or {}).get("submissionMode", "K8sJobMode") == "K8sJobMode" \
            and "submitterPodTemplate" not in doc["spec"]:
        errs.append(f"{where}.spec: K8sJobMode needs a submitterPodTemplate (the default submitter has no token "
                    f"and no securityContext)")
    return errs


def check_container_hardening(c: dict, pod_sc: dict, mounts_tmp: bool, where: str) -> list[str]:
    sc = c.get("securityContext")
    if not isinstance(sc, dict):
        return [f"{where}: no securityContext"]
    errs = []
    if sc.get("runAsNonRoot") is not True:
        errs.append(f"{where}: securityContext.runAsNonRoot must be true")
    if sc.get("allowPrivilegeEscalation") is not False:
        errs.append(f"{where}: securityContext.allowPrivilegeEscalation must be false")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        errs.append(f"{where}: securityContext.capabilities.drop must include ALL")
    if sc.get("privileged"):
        errs.append(f"{where}: privileged")
    if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
        errs.append(f"{where}: runAsUser 0 is root")
    if "readOnlyRootFilesystem" not in sc:
        errs.append(f"{where}: readOnlyRootFilesystem must be stated (true, or false with a reason)")
    if sc.get("readOnlyRootFilesystem") and not mounts_tmp:
        errs.append(f"{where}: a read-only root filesystem needs a writable /tmp (an emptyDir)")
    return errs


def check_pod_hardening(tpl: dict, where: str) -> list[str]:
    """Every container non-root with no privilege escalation and no capabilities; no host namespaces or paths."""
    spec = tpl.get("spec") or {}
    pod_sc = spec.get("securityContext") or {}
    errs = []
    if pod_sc.get("runAsNonRoot") is not True:
        errs.append(f"{where}: pod securityContext.runAsNonRoot must be true")
    for k in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(k):
            errs.append(f"{where}: {k}")
    errs += [f"{where}: hostPath volume {v.get('name')}" for v in spec.get("volumes") or [] if "hostPath" in v]
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        mounts_tmp = any(m.get("mountPath") == "/tmp" for m in c.get("volumeMounts") or [])
        errs += check_container_hardening(c, pod_sc, mounts_tmp, f"{where}.containers[{c.get('name')}]")
        for e in c.get("env") or []:
            if e.get("name") in AWS_KEY_ENV:
                errs.append(f"{where}.containers[{c.get('name')}]: {e['name']} in env; S3 access comes from IRSA "
                            f"(a service account annotation) or a mounted credentials file")
    return errs


def check_hardening(doc: dict) -> list[str]:
    errs = [e for w, t in pod_templates(doc) for e in check_pod_hardening(t, w)]
    spec = cluster_spec_of(doc)
    if spec and spec.get("enableInTreeAutoscaling"):
        # The autoscaler sidecar is built by KubeRay; autoscalerOptions.securityContext is all we control of it.
        where = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}.autoscalerOptions"
        errs += check_container_hardening(spec.get("autoscalerOptions") or {}, {}, False, where)
    return errs


def check_api_token(doc: dict) -> list[str]:
    """Ray pods mount no Kubernetes API token, except a head whose autoscaler sidecar needs one (KubeRay binds the
    autoscaler's Role to the head's service account); job code on any pod could otherwise use it."""
    spec = cluster_spec_of(doc)
    errs = []
    for where, role, tpl in ray_pod_templates(doc):
        if role == "head" and spec and spec.get("enableInTreeAutoscaling"):
            continue
        if (tpl.get("spec") or {}).get("automountServiceAccountToken") is not False:
            errs.append(f"{where}: automountServiceAccountToken must be false (no Kubernetes API for job code)")
    return errs


def check_services(doc: dict) -> list[str]:
    """Nothing we define is reachable from outside the cluster: no LoadBalancer / NodePort / Ingress."""
    where = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    errs = []
    if doc.get("kind") == "Service" and (doc.get("spec") or {}).get("type", "ClusterIP") in EXPOSING_SERVICE_TYPES:
        errs.append(f"{where}: type {doc['spec']['type']} exposes it outside the cluster; use ClusterIP")
    spec = cluster_spec_of(doc)
    if spec:
        head = spec.get("headGroupSpec") or {}
        if head.get("serviceType") != "ClusterIP":
            errs.append(f"{where}.headGroupSpec.serviceType must be ClusterIP (got {head.get('serviceType')!r})")
        svc_type = ((head.get("headService") or {}).get("spec") or {}).get("type", "ClusterIP")
        if svc_type in EXPOSING_SERVICE_TYPES:
            errs.append(f"{where}.headGroupSpec.headService: type {svc_type}; use ClusterIP")
        if head.get("enableIngress"):
            errs.append(f"{where}.headGroupSpec.enableIngress exposes the dashboard")
    return errs


def _selects(policy: dict, labels: dict) -> bool:
    sel = ((policy.get("spec") or {}).get("podSelector") or {})
    return bool(sel.get("matchLabels")) and not sel.get("matchExpressions") and \
        sel["matchLabels"].items() <= labels.items()


def check_network_policies(docs: list[dict]) -> list[str]:
    """Every Ray head and worker pod is selected by an Ingress NetworkPolicy none of whose rules admits everyone."""
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    errs = []
    for p in policies:
        rules = (p.get("spec") or {}).get("ingress") or []
        if "Ingress" not in ((p.get("spec") or {}).get("policyTypes") or ["Ingress"]):
            errs.append(f"NetworkPolicy/{p['metadata']['name']}: policyTypes must include Ingress")
        if any(not r.get("from") for r in rules):
            errs.append(f"NetworkPolicy/{p['metadata']['name']}: an ingress rule without `from` admits every peer")
    for doc in docs:
        for where, role, tpl in ray_pod_templates(doc):
            if role == "submitter":
                continue
            # KubeRay adds ray.io/node-type to the pods it creates from these templates.
            labels = {**((tpl.get("metadata") or {}).get("labels") or {}), "ray.io/node-type": role}
            if not any(_selects(p, labels) for p in policies):
                errs.append(f"{where}: no NetworkPolicy selects this {role} pod (labels {labels})")
    return errs


def mlflow_auth_errors(docs: list[dict], installed_apps: set[str]) -> list[str]:
    """The MLflow server runs MLflow's basic-auth app, its secrets from Secrets, its S3 access from IRSA."""
    server = next((d for d in docs if d.get("kind") == "Deployment" and d["metadata"]["name"] == "mlflow"), None)
    if server is None:
        return ["no Deployment/mlflow"]
    pod = server["spec"]["template"]["spec"]
    c = pod["containers"][0]
    errs = []
    args = [str(a) for a in c.get("args") or []]
    app = args[args.index("--app-name") + 1] if "--app-name" in args[:-1] else None
    if app != "basic-auth":
        errs.append(f"Deployment/mlflow: args must include --app-name basic-auth (got {app!r})")
    elif app not in installed_apps:
        errs.append(f"--app-name {app} is not an app the installed mlflow offers ({sorted(installed_apps)})")
    env = _env(c)
    for name in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        if "secretKeyRef" not in ((env.get(name) or {}).get("valueFrom") or {}):
            errs.append(f"Deployment/mlflow: {name} must come from a Secret")
    config_path = (env.get("MLFLOW_AUTH_CONFIG_PATH") or {}).get("value", "")
    mount = next((m for m in c.get("volumeMounts") or [] if config_path.startswith(m["mountPath"] + "/")), None)
    volume = next((v for v in pod.get("volumes") or [] if mount and v["name"] == mount["name"]), {})
    cm_name = (volume.get("configMap") or {}).get("name")
    cm = next((d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == cm_name), None)
    if cm is None:
        errs.append("Deployment/mlflow: MLFLOW_AUTH_CONFIG_PATH must name a file of a mounted ConfigMap")
    else:
        import configparser
        ini = configparser.ConfigParser()
        ini.read_string(cm["data"][config_path.rsplit("/", 1)[1]])
        if "admin_password" in ini["mlflow"]:
            errs.append(f"ConfigMap/{cm_name}: admin_password belongs in a Secret (MLFLOW_AUTH_ADMIN_PASSWORD)")
        if not ini["mlflow"].get("database_uri", "").startswith("postgresql://"):
            errs.append(f"ConfigMap/{cm_name}: the auth database must be durable (postgresql://), not a pod file")
    if (env.get("MLFLOW_SERVE_ARTIFACTS") or {}).get("value") != "true":
        errs.append("Deployment/mlflow: artifacts must be proxied by the server (MLFLOW_SERVE_ARTIFACTS=true)")
    sa = next((d for d in docs if d.get("kind") == "ServiceAccount"
               and d["metadata"]["name"] == pod.get("serviceAccountName")), None)
    if sa is None or "eks.amazonaws.com/role-arn" not in ((sa.get("metadata") or {}).get("annotations") or {}):
        errs.append("Deployment/mlflow: S3 access through a service account with an IRSA role annotation")
    return errs


def dockerfile_user(text: str) -> str | None:
    """The user of the image's last USER line (None when there is none: the base image's user)."""
    users = re.findall(r"^\s*USER\s+(\S+)", text, re.M | re.I)
    return users[-1] if users else None


def is_root_user(user: str | None) -> bool:
    return user is None or user.split(":")[0] in ("root", "0")
