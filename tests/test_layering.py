"""The import rules of CONVENTIONS.md: jobs -> pipeline, bert_core; bert_core is torch-only; pipeline is model-free."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "bert_core": {"ray", "mlflow", "fsspec", "pyarrow", "s3fs", "pipeline", "jobs"},
    "pipeline": {"bert_core", "jobs", "mlflow"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    bad = {str(f.relative_to(REPO)): sorted(imported_roots(f) & FORBIDDEN[package]) for f in files}
    assert not {k: v for k, v in bad.items() if v}


def test_no_print_in_library_code():
    offenders = []
    for package in FORBIDDEN:
        for f in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    offenders.append(f"{f.relative_to(REPO)}:{node.lineno}")
    assert not offenders, "use logging in library code: " + ", ".join(offenders)
