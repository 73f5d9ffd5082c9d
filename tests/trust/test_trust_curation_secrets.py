"""Check trust-curation-secrets (issue 43, item 1-2): credentials in `--decontaminate` and `--mix` URLs (a URL's
userinfo, a token query, a percent-encoded parameter name `?%74oken=X` that the server decodes to `token`) are used by
the build and appear in no file of its output (shards, manifest.json with the mix statistics keyed by source,
reports/dropped.jsonl and edited.jsonl), in the MLflow store (sqlite db and artifacts) or in the job's log.

The corpus and the evaluation set are served over http on loopback by a server that answers 403 unless the request
carries the credentials, so a build that succeeds has used them. The URLs reach the job in an @FILE (a command line
with them is refused: tests/jobs/test_argv_secrets.py).
"""
from __future__ import annotations

import base64
import functools
import gzip
import http.server
import json
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"
VOCAB = SAMPLE / "reference" / "bert-base-uncased-vocab.txt"
TASKS = REPO.parent / "shared" / "data" / "tasks"

USER, PASSWORD = "reader", "CANARYUSERPW7"
TOKEN, ENCODED = "CANARYQUERYTOKEN7", "CANARYPCTTOKEN7"
CANARIES = (PASSWORD, TOKEN, ENCODED)


class _Guarded(http.server.SimpleHTTPRequestHandler):
    """The folder over http, only to a request carrying the build's credentials: Basic auth with PASSWORD (the
    userinfo), or the token in the query, under the name `token` once percent-decoded."""

    seen: list[str] = []

    def log_message(self, *args) -> None:
        pass

    def _allowed(self) -> bool:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic ") and base64.b64decode(auth[6:]).decode() == f"{USER}:{PASSWORD}":
            return True
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        return query.get("token") in ([TOKEN], [ENCODED])

    def _guard(self, send) -> None:
        type(self).seen.append(self.path)
        if not self._allowed():
            self.send_error(403, "credentials required")
            return
        send()

    def do_GET(self) -> None:
        self._guard(super().do_GET)

    def do_HEAD(self) -> None:
        self._guard(super().do_HEAD)


@pytest.fixture
def guarded_server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Guarded, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _passages(n_words: int, n: int) -> list[dict]:
    out = []
    with gzip.open(SAMPLE / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        for doc in map(json.loads, f):
            w = doc["text"].split()
            out += [{"id": f"{doc['id']}@{i}", "text": " ".join(w[i:i + n_words])}
                    for i in range(0, len(w) - n_words + 1, n_words)]
            if len(out) >= n:
                return out[:n]
    return out


def _files_holding(root: Path, needles, skip=()) -> list[str]:
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not any(s in p.parts for s in skip):
            data = p.read_bytes()
            found += [f"{p.relative_to(root)}: {n}" for n in needles if n.encode() in data]
    return found


def test_check_trust_curation_secrets(tmp_path, guarded_server, mlflow_uri):
    root, host = guarded_server
    if not (TASKS / "rt_sentiment.jsonl.gz").is_file():
        pytest.skip(f"needs the shared tasks at {TASKS}")
    docs = _passages(60, 400)
    with gzip.open(TASKS / "rt_sentiment.jsonl.gz", "rt", encoding="utf-8") as f:
        evals = [r["text"] for r in map(json.loads, f) if len(r["text"].split()) >= 15][:5]
    for k, e in enumerate(evals):  # planted: the decontamination drops (dropped.jsonl) and cuts (edited.jsonl)
        docs[k * 40]["text"] += " " + e
    half = len(docs) // 2
    (root / "a").mkdir()
    (root / "b").mkdir()
    (root / "a" / "part.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[:half]))
    (root / "b" / "part.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[half:]))
    (root / "evals.jsonl").write_text("".join(json.dumps({"id": f"e{i}", "text": t}) + "\n"
                                              for i, t in enumerate(evals)))
    userinfo = f"http://{USER}:{PASSWORD}@{host}/a/part.jsonl"
    token = f"http://{host}/b/part.jsonl?%74oken={TOKEN}"
    # Either credential opens it: the userinfo, and a parameter the server decodes to `token`.
    evals_url = f"http://{USER}:{PASSWORD}@{host}/evals.jsonl?%74oken={ENCODED}"
    args = tmp_path / "private" / "build.args"
    args.parent.mkdir()
    args.write_text("\n".join(["--input", userinfo, "--input", token, "--decontaminate", evals_url,
                               "--mix", f"{userinfo}=2,{token}=0.5"]) + "\n")
    args.chmod(0o600)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "jobs.build_dataset", f"@{args}", "--output", str(out), "--vocab", str(VOCAB),
         "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--dupe-factor", "1", "--num-shards", "2",
         "--no-ray", "--decontaminate-mode", "cut", "--mlflow-tracking-uri", mlflow_uri, "--log-level", "INFO"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # The build used every credential: the server answered each file, and the data came through.
    assert any(TOKEN in p for p in _Guarded.seen) and any(ENCODED in p for p in _Guarded.seen)
    manifest = json.loads((out / "manifest.json").read_text())
    mix = manifest["curation"]["mix"]
    assert {s["weight"] for s in mix.values()} == {2.0, 0.5}, mix
    assert any(k.startswith(f"http://REDACTED@{host}/a/") for k in mix), list(mix)
    assert any("token=REDACTED" in k for k in mix), list(mix)
    # The reports quote the evaluation file that matched (its URL, redacted): the place the secrets were.
    reports = (out / "reports" / "dropped.jsonl").read_text() + (out / "reports" / "edited.jsonl").read_text()
    assert f"http://REDACTED@{host}/evals.jsonl?token=REDACTED" in reports, reports[:2000]
    # ... and none of them is anywhere it wrote: the output, the MLflow store, the log.
    assert _files_holding(tmp_path, CANARIES, skip=("served", "private")) == []
    log = done.stdout + done.stderr
    assert [c for c in CANARIES if c in log] == [], log[-3000:]
