"""The import rules of CONVENTIONS.md: jobs -> workflows, finetuning -> training -> pipeline, bert_core; bert_core is
torch-only; pipeline is model-free; training imports Ray only in its launcher and MLflow only in its tracking module;
finetuning and workflows use those two modules and import neither Ray nor MLflow."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = {"bert_core", "pipeline", "training", "finetuning", "workflows", "jobs"}
# Which of our packages each package may import (itself included): the allowed list, not a forbidden one.
ALLOWED = {
    "bert_core": {"bert_core"},
    "pipeline": {"pipeline"},
    "training": {"training", "pipeline", "bert_core"},
    "finetuning": {"finetuning", "training", "pipeline", "bert_core"},
    "workflows": {"workflows", "training", "pipeline"},
    "jobs": {"jobs", "workflows", "finetuning", "training", "pipeline", "bert_core"},
}
# Third-party packages a layer must stay free of.
THIRD_PARTY_FORBIDDEN = {
    "bert_core": {"ray", "mlflow", "fsspec", "pyarrow", "s3fs"},
    "pipeline": {"mlflow"},
    "training": {"ray", "mlflow"},
    "finetuning": {"ray", "mlflow"},
    "workflows": {"ray", "mlflow"},
    "jobs": {"ray", "mlflow"},  # jobs are flags -> configs -> one call: Ray and MLflow live in training
}
# The one module of training/ that may import each of these.
ONLY_IN = {"ray": "training/launch.py", "mlflow": "training/tracking.py"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package):
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    bad = {}
    for f in files:
        rel = f.relative_to(REPO).as_posix()
        roots = imported_roots(f)
        wrong = (roots & OURS) - ALLOWED[package]
        forbidden = roots & THIRD_PARTY_FORBIDDEN.get(package, set())
        wrong |= {m for m in forbidden if ONLY_IN.get(m) != rel}
        if wrong:
            bad[rel] = sorted(wrong)
    assert not bad


def test_training_imports_without_ray_or_mlflow():
    """Importing the trainer (as `fit` without Ray does) must not pull in Ray or MLflow."""
    import subprocess
    import sys

    code = ("import sys, training, finetuning.loop, training.checkpoint; "
            "print(sorted(m for m in ('ray', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_build_job_imports_without_torch():
    """The dataset build starts Ray and opens an MLflow run through training's modules; neither may load torch
    (1.5 s of a 1 MB build's wall time on a 2-core box)."""
    import subprocess
    import sys

    code = "import sys, jobs.build_dataset; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_no_print_in_library_code():
    offenders = []
    for package in ("bert_core", "pipeline", "training", "finetuning", "workflows"):
        for f in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    offenders.append(f"{f.relative_to(REPO)}:{node.lineno}")
    assert not offenders, "use logging in library code: " + ", ".join(offenders)
