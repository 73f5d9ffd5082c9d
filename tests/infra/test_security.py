"""infra/ is secure by default (docs/security.md): Ray token auth from a Secret on every Ray container, every
container non-root without privilege escalation, nothing exposed outside the cluster, NetworkPolicies around the
Ray pods, the team MLflow server behind authentication with server-side S3 credentials, non-root images, the
cluster launcher's Ray with token auth and its dashboard on loopback, and every port we open documented.

Each check is a function in _infra_checks.py returning a list of errors, run on our manifests (must be empty)
and on broken copies of them (must name the break), so none of them can pass vacuously.
"""
from __future__ import annotations

import copy
import re
from importlib.metadata import entry_points

import pytest
import yaml
from _infra_checks import (
    CLUSTER_YAMLS,
    INFRA,
    K8S_YAMLS,
    REPO,
    check_api_token,
    check_hardening,
    check_network_policies,
    check_ray_token_auth,
    check_services,
    cluster_spec_of,
    dockerfile_user,
    is_root_user,
    load_all,
    mlflow_auth_errors,
    pod_templates,
)

ALL_DOCS = [(p.name, d) for p in K8S_YAMLS for d in load_all(p)]
IDS = [f"{n}:{d['kind']}/{d['metadata']['name']}" for n, d in ALL_DOCS]
RAY_DOCS = [(n, d) for n, d in ALL_DOCS if cluster_spec_of(d) is not None]
MLFLOW_DOCS = load_all(INFRA / "mlflow" / "mlflow.yaml")
MLFLOW_APPS = {e.name for e in entry_points(group="mlflow.app")}
SECURITY_MD = REPO / "docs" / "security.md"


def _doc(name: str, kind: str) -> dict:
    return copy.deepcopy(next(d for n, d in ALL_DOCS if n == name and d["kind"] == kind))


@pytest.mark.parametrize("name,doc", RAY_DOCS, ids=[n for n, _ in RAY_DOCS])
def test_ray_token_auth_from_a_secret(name, doc):
    assert check_ray_token_auth(doc) == []


@pytest.mark.parametrize("name,doc", ALL_DOCS, ids=IDS)
def test_every_container_is_hardened(name, doc):
    assert check_hardening(doc) == []


@pytest.mark.parametrize("name,doc", ALL_DOCS, ids=IDS)
def test_nothing_is_exposed_outside_the_cluster(name, doc):
    assert check_services(doc) == []


def test_network_policies_select_every_ray_pod():
    docs = [d for _, d in ALL_DOCS]
    assert any(d["kind"] == "NetworkPolicy" for d in docs)
    assert check_network_policies(docs) == []


def test_mlflow_server_runs_with_authentication():
    assert "basic-auth" in MLFLOW_APPS, "the installed mlflow no longer ships the basic-auth app"
    assert mlflow_auth_errors(MLFLOW_DOCS, MLFLOW_APPS) == []


def test_the_ray_pods_service_accounts_exist_with_irsa():
    """S3 comes from IRSA: every service account a Ray pod names is defined here, with a role annotation."""
    accounts = {d["metadata"]["name"]: d for _, d in ALL_DOCS if d["kind"] == "ServiceAccount"}
    used = {(t.get("spec") or {}).get("serviceAccountName") for _, d in RAY_DOCS
            for t in [cluster_spec_of(d)["headGroupSpec"]["template"]]
            + [g["template"] for g in cluster_spec_of(d)["workerGroupSpecs"]]}
    assert None not in used, "every Ray pod names its service account (the default one has no S3 role)"
    for name in used:
        assert "eks.amazonaws.com/role-arn" in accounts[name]["metadata"].get("annotations", {}), name


@pytest.mark.parametrize("name,doc", RAY_DOCS, ids=[n for n, _ in RAY_DOCS])
def test_ray_pods_mount_no_kubernetes_token_they_do_not_need(name, doc):
    assert check_api_token(doc) == []


def test_the_api_token_check_catches():
    doc = _doc("rayjob-pretrain.yaml", "RayJob")
    cluster_spec_of(doc)["headGroupSpec"]["template"]["spec"].pop("automountServiceAccountToken")
    cluster_spec_of(doc)["workerGroupSpecs"][0]["template"]["spec"]["automountServiceAccountToken"] = True
    assert len(check_api_token(doc)) == 2


# --- each check fails on a broken copy -----------------------------------------------------------------------

def _head(doc):
    return cluster_spec_of(doc)["headGroupSpec"]


def _env_without(container, name):
    container["env"] = [e for e in container["env"] if e["name"] != name]


@pytest.mark.parametrize("mutate,expect", [
    (lambda d: _env_without(_head(d)["template"]["spec"]["containers"][0], "RAY_AUTH_MODE"), "RAY_AUTH_MODE"),
    (lambda d: _head(d)["template"]["spec"]["containers"][0]["env"].__setitem__(
        1, {"name": "RAY_AUTH_TOKEN", "value": "x"}), "from a Secret"),
    (lambda d: _env_without(cluster_spec_of(d)["workerGroupSpecs"][0]["template"]["spec"]["containers"][0],
                            "RAY_AUTH_TOKEN"), "RAY_AUTH_TOKEN"),
    (lambda d: cluster_spec_of(d).pop("authOptions"), "authOptions"),
    (lambda d: _env_without(cluster_spec_of(d)["autoscalerOptions"], "RAY_AUTH_MODE"), "autoscalerOptions"),
], ids=["head-no-mode", "head-literal-token", "worker-no-token", "no-authOptions", "autoscaler-no-mode"])
def test_token_check_catches(mutate, expect):
    doc = _doc("raycluster.yaml", "RayCluster")
    mutate(doc)
    assert any(expect in e for e in check_ray_token_auth(doc)), check_ray_token_auth(doc)


def test_token_check_catches_a_rayjob_without_submitter_template():
    doc = _doc("rayjob-pretrain.yaml", "RayJob")
    doc["spec"].pop("submitterPodTemplate")
    assert any("submitterPodTemplate" in e for e in check_ray_token_auth(doc))


def _ray_container(d):
    return _head(d)["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("mutate,expect", [
    (lambda d: _ray_container(d).pop("securityContext"), "no securityContext"),
    (lambda d: _ray_container(d)["securityContext"].__setitem__("runAsNonRoot", False), "runAsNonRoot"),
    (lambda d: _ray_container(d)["securityContext"].pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation"),
    (lambda d: _ray_container(d)["securityContext"].__setitem__("capabilities", {"add": ["SYS_ADMIN"]}), "drop"),
    (lambda d: _ray_container(d)["securityContext"].__setitem__("runAsUser", 0), "root"),
    (lambda d: _head(d)["template"]["spec"].pop("securityContext"), "pod securityContext"),
    (lambda d: _head(d)["template"]["spec"].__setitem__("hostNetwork", True), "hostNetwork"),
    (lambda d: _ray_container(d)["env"].append({"name": "AWS_ACCESS_KEY_ID", "valueFrom": {
        "secretKeyRef": {"name": "s3", "key": "id"}}}), "AWS_ACCESS_KEY_ID"),
    (lambda d: cluster_spec_of(d)["autoscalerOptions"].pop("securityContext"), "autoscalerOptions"),
], ids=["no-sc", "root-allowed", "escalation", "caps", "uid0", "no-pod-sc", "host-net", "aws-key", "autoscaler"])
def test_hardening_check_catches(mutate, expect):
    doc = _doc("raycluster.yaml", "RayCluster")
    mutate(doc)
    assert any(expect in e for e in check_hardening(doc)), check_hardening(doc)


def test_hardening_check_catches_a_read_only_root_without_tmp():
    doc = _doc("mlflow.yaml", "Deployment")
    c = doc["spec"]["template"]["spec"]["containers"][0]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/tmp"]
    assert any("/tmp" in e for e in check_hardening(doc))


@pytest.mark.parametrize("kind,mutate,expect", [
    ("Service", lambda d: d["spec"].__setitem__("type", "LoadBalancer"), "LoadBalancer"),
    ("Service", lambda d: d["spec"].__setitem__("type", "NodePort"), "NodePort"),
    ("RayCluster", lambda d: _head(d).__setitem__("serviceType", "LoadBalancer"), "serviceType"),
    ("RayCluster", lambda d: _head(d).__setitem__("enableIngress", True), "enableIngress"),
], ids=["svc-lb", "svc-nodeport", "head-lb", "head-ingress"])
def test_service_check_catches(kind, mutate, expect):
    doc = _doc("mlflow.yaml" if kind == "Service" else "raycluster.yaml", kind)
    mutate(doc)
    assert any(expect in e for e in check_services(doc)), check_services(doc)


def test_network_policy_check_catches():
    docs = [copy.deepcopy(d) for _, d in ALL_DOCS]
    head_policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and
                       d["spec"]["podSelector"]["matchLabels"].get("ray.io/node-type") == "head")
    without = [d for d in docs if d is not head_policy]
    assert any("no NetworkPolicy selects this head" in e for e in check_network_policies(without))
    head_policy["spec"]["ingress"].append({"ports": [{"port": 8265}]})
    assert any("admits every peer" in e for e in check_network_policies(docs))


@pytest.mark.parametrize("mutate,expect", [
    (lambda ds: _mlflow(ds)["containers"][0]["args"].__setitem__(1, "nope"), "--app-name basic-auth"),
    (lambda ds: _mlflow(ds)["containers"][0].__setitem__("args", ["--host", "0.0.0.0"]), "--app-name basic-auth"),
    (lambda ds: _mlflow(ds)["containers"][0]["env"].append(
        {"name": "MLFLOW_AUTH_ADMIN_PASSWORD", "value": "x"}) or _drop_first(ds, "MLFLOW_AUTH_ADMIN_PASSWORD"),
     "MLFLOW_AUTH_ADMIN_PASSWORD"),
    (lambda ds: _drop_first(ds, "MLFLOW_AUTH_CONFIG_PATH"), "ConfigMap"),
    (lambda ds: _drop_first(ds, "MLFLOW_SERVE_ARTIFACTS"), "proxied"),
    (lambda ds: _mlflow(ds).pop("serviceAccountName"), "IRSA"),
], ids=["wrong-app", "no-app", "literal-admin-pw", "no-config", "no-proxy", "no-irsa"])
def test_mlflow_auth_check_catches(mutate, expect):
    docs = copy.deepcopy(MLFLOW_DOCS)
    mutate(docs)
    assert any(expect in e for e in mlflow_auth_errors(docs, MLFLOW_APPS)), mlflow_auth_errors(docs, MLFLOW_APPS)


def _mlflow(docs):
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow")["spec"][
        "template"]["spec"]


def _drop_first(docs, name):
    env = _mlflow(docs)["containers"][0]["env"]
    env.pop(next(i for i, e in enumerate(env) if e["name"] == name))


# --- images, the cluster launcher, the bare-host MLflow command, the ports table ------------------------------

@pytest.mark.parametrize("path", [INFRA / "docker" / "Dockerfile", INFRA / "mlflow" / "Dockerfile"],
                         ids=["bert-pretrain", "mlflow"])
def test_images_run_as_a_non_root_user(path):
    user = dockerfile_user(path.read_text())
    assert not is_root_user(user), f"{path.relative_to(REPO)}: the last USER must be a non-root user (got {user})"


def test_the_user_check_catches_root():
    assert is_root_user(dockerfile_user("FROM x\nUSER 1000\nRUN y\nUSER root\n"))
    assert is_root_user(dockerfile_user("FROM x\nUSER 0:0\n"))
    assert is_root_user(dockerfile_user("FROM x\n"))
    assert not is_root_user(dockerfile_user("FROM x\nUSER 1000:100\n"))


def launcher_auth_errors(config: dict) -> list[str]:
    errs = []
    run_options = " ".join((config.get("docker") or {}).get("run_options") or [])
    if "--env RAY_AUTH_MODE=token" not in run_options:
        errs.append("docker.run_options must set RAY_AUTH_MODE=token for every Ray process on every node")
    if (config.get("file_mounts") or {}).get("~/.ray/auth_token") != "~/.ray/auth_token":
        errs.append("file_mounts must carry the token file ~/.ray/auth_token to every node")
    head = " ".join(config.get("head_start_ray_commands") or [])
    if "--dashboard-host=127.0.0.1" not in head:
        errs.append("the head's dashboard must listen on loopback (reached through `ray dashboard`)")
    return errs


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=[p.parent.name for p in CLUSTER_YAMLS])
def test_launcher_starts_ray_with_token_auth(path):
    config = yaml.safe_load(path.read_text())
    assert launcher_auth_errors(config) == []
    broken = copy.deepcopy(config)
    broken["docker"]["run_options"] = [o for o in broken["docker"]["run_options"] if "RAY_AUTH_MODE" not in o]
    broken["file_mounts"].pop("~/.ray/auth_token")
    broken["head_start_ray_commands"] = [c.replace("127.0.0.1", "0.0.0.0") for c in config["head_start_ray_commands"]]
    assert len(launcher_auth_errors(broken)) == 3


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=[p.parent.name for p in CLUSTER_YAMLS])
def test_launcher_states_its_firewall(path):
    """The launcher YAML says which ports are open to whom (the security group / firewall rules)."""
    text = path.read_text()
    assert re.search(r"^# Firewall", text, re.M), f"{path.relative_to(REPO)} has no '# Firewall' section"
    for port in ("22", "6379", "8265"):
        assert re.search(rf"^#.*\b{port}\b", text, re.M), f"{path.relative_to(REPO)}: port {port} not stated"


def _code_blocks(path) -> list[str]:
    blocks = re.findall(r"```[a-z]*\n(.*?)```", path.read_text(), re.S)
    return [" ".join(b.replace("\\\n", " ").split()) for b in blocks]


def test_the_bare_host_mlflow_command_binds_loopback_with_auth():
    commands = [c for b in _code_blocks(INFRA / "README.md") for c in re.findall(r"mlflow server .*", b)]
    assert commands, "infra/README.md shows no `mlflow server` command"
    for cmd in commands:
        assert "--host 127.0.0.1" in cmd and "0.0.0.0" not in cmd, cmd
        assert "--app-name basic-auth" in cmd, cmd


def _declared_ports() -> set[int]:
    ports: set[int] = set()
    for _, doc in ALL_DOCS:
        for _, tpl in pod_templates(doc):
            for c in (tpl.get("spec") or {}).get("containers") or []:
                ports |= {p["containerPort"] for p in c.get("ports") or []}
    for path in CLUSTER_YAMLS:
        text = " ".join(yaml.safe_load(path.read_text())["head_start_ray_commands"])
        ports |= {int(p) for p in re.findall(r"--[a-z-]*port=(\d+)", text)}
    return ports


def test_docs_security_lists_every_port_we_open():
    ports = _declared_ports()
    assert {6379, 8265, 10001, 5000, 5432, 8076} <= ports
    table = SECURITY_MD.read_text()
    missing = sorted(p for p in ports if not re.search(rf"^\|[^\n]*\b{p}\b", table, re.M))
    assert missing == [], f"docs/security.md's port table lacks {missing}"
