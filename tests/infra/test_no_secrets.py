"""No credential is ever committed: scan every file git would commit for secret-shaped values.

Secrets reach pods through Kubernetes Secrets (`secretKeyRef`), nodes through IAM roles / service accounts, and
local tests through fixtures that set throwaway values in the environment at run time.
"""
from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from _infra_checks import INFRA, REPO

PATTERNS = {
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "AWS secret access key": re.compile(r"aws_secret_access_key\s*[:=]\s*['\"]?[A-Za-z0-9/+=]{40}", re.I),
    "private key": re.compile(r"-----BEGIN (RSA |EC |OPENSSH |DSA )?PRIVATE KEY-----"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    # user:password@host in a URL, unless the password is a reference expanded at run time ($(X), ${X}, $X).
    "password in a URL": re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@'\"]+:(?!\$)(?P<pw>[^@\s/'\"]+)@[\w.-]+", re.I),
}
ALLOWED_LITERALS = {"testing"}  # moto's throwaway credentials, set by tests/conftest.py at run time
# Passwords that are placeholders by construction: the redaction's docstring example and the canaries the secret
# tests plant to prove they never reach a log (tests/storage/test_redact.py, tests/jobs/test_secrets_and_listeners.py).
PLACEHOLDER_PASSWORD = re.compile(r"^(password|PASSWORD|p|CANARY\w*)$")


def committed_text_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    for rel in out:
        p = REPO / rel
        if not p.is_file() or p.stat().st_size > 2_000_000 or p.suffix in {".gz", ".parquet", ".safetensors"}:
            continue
        try:
            yield rel, p.read_text()
        except UnicodeDecodeError:
            continue


def test_no_secret_patterns_in_any_file():
    hits = [(rel, name, m.group(0)[:20] + "...")
            for rel, text in committed_text_files()
            for name, pat in PATTERNS.items()
            for m in pat.finditer(text)
            if not ("pw" in pat.groupindex and PLACEHOLDER_PASSWORD.match(m.group("pw")))]
    assert hits == []


def _literal_secret_values(node, path=""):
    """Map entries whose key names a secret and whose value is a literal (not a reference / empty)."""
    if isinstance(node, dict):
        if isinstance(node.get("name"), str) and "value" in node and re.search(
                r"PASSWORD|SECRET|ACCESS_KEY|TOKEN", node["name"]):
            yield f"{path}.{node['name']}"
        for k, v in node.items():
            # A boolean is a switch and a home-relative path a location, not secrets
            # (automountServiceAccountToken: false; file_mounts' `~/.ray/auth_token: ~/.ray/auth_token`).
            if re.search(r"password|secret_?access|token|access_?key", str(k), re.I) and isinstance(v, (str, int)) \
                    and not isinstance(v, bool) and str(v) and not str(v).startswith(("$", "<", "~/")):
                yield f"{path}.{k}"
            yield from _literal_secret_values(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _literal_secret_values(v, f"{path}[{i}]")


@pytest.mark.parametrize("path", sorted(INFRA.rglob("*.yaml")) + sorted((REPO / "configs").glob("*.yaml")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_literal_secret_values_in_yaml(path):
    for doc in yaml.safe_load_all(path.read_text()):
        assert list(_literal_secret_values(doc)) == []
        assert not (isinstance(doc, dict) and doc.get("kind") == "Secret" and (doc.get("data") or doc.get(
            "stringData"))), "a Secret with values in a file"


def test_the_scanner_finds_what_it_should():
    fake_key = "AKIA" + "ABCDEFGHIJKLMNOP"
    assert PATTERNS["AWS access key id"].search(f"key = {fake_key}")
    assert PATTERNS["password in a URL"].search("postgresql://mlflow:" + "hunter2@db:5432/mlflow")
    assert not PATTERNS["password in a URL"].search("postgresql://mlflow:$(POSTGRES_PASSWORD)@db:5432/mlflow")
    assert list(_literal_secret_values({"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "abc"}]}))
    assert not list(_literal_secret_values({"env": [{"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {}}]}))
    assert list(_literal_secret_values({"auth_token": "abc"}))
    assert not list(_literal_secret_values({"automountServiceAccountToken": False}))
    assert not list(_literal_secret_values({"~/.ray/auth_token": "~/.ray/auth_token"}))
