"""The import rules of CONVENTIONS.md and docs/architecture.md: jobs -> workflows, pretraining, finetuning -> training
(the runtime both trainers share) -> tracking, pipeline, bert_core; the two trainers never import each other;
bert_core is torch-only; pipeline is model-free; MLflow is imported only under tracking/, Ray only by the training
launcher (training/launch.py and its torch rendezvous, training/rendezvous.py), the build's engine
(pipeline/build/ray_*.py), curation's Ray Data computations (pipeline/curate/ray_*.py) and Ray's start-up, which
the build and the launcher both use (pipeline/cluster/ray_start.py)."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = {"bert_core", "pipeline", "tracking", "training", "pretraining", "finetuning", "workflows", "jobs"}
# Which of our packages each package may import (itself included): the allowed list, not a forbidden one.
ALLOWED = {
    "bert_core": {"bert_core"},
    "pipeline": {"pipeline"},
    "tracking": {"tracking", "pipeline"},
    "training": {"training", "tracking", "pipeline", "bert_core"},
    "pretraining": {"pretraining", "training", "tracking", "pipeline", "bert_core"},
    "finetuning": {"finetuning", "training", "tracking", "pipeline", "bert_core"},
    "workflows": {"workflows", "training", "tracking", "pipeline"},
    "jobs": {"jobs", "workflows", "pretraining", "finetuning", "training", "tracking", "pipeline", "bert_core"},
}
PACKAGES = sorted(ALLOWED)


def may_import(module: str, rel: str) -> bool:
    """MLflow only under tracking/; Ray only in the training launcher, the build's engine and curation's Ray Data
    computations."""
    if module == "mlflow":
        return rel.startswith("tracking/")
    if module == "ray":
        return rel in ("training/launch.py", "training/rendezvous.py", "pipeline/cluster/ray_start.py") or (
            rel.startswith(("pipeline/build/ray_", "pipeline/curate/ray_")) and rel.endswith(".py"))
    if module in ("fsspec", "pyarrow", "s3fs"):
        return not rel.startswith("bert_core/")
    return True


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
        wrong |= {m for m in roots - OURS if not may_import(m, rel)}
        if wrong:
            bad[rel] = sorted(wrong)
    assert not bad


def loaded_by(imports: str, roots: tuple[str, ...]) -> list[str]:
    """The modules under `roots` that `import <imports>` loads, in a fresh interpreter."""
    import json
    import subprocess
    import sys

    code = (f"import json, sys, {imports}; "
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {roots!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_training_imports_without_ray_or_mlflow():
    """Importing the trainer (as `fit` without Ray does) must not pull in Ray or MLflow."""
    assert loaded_by("training.launch, training.worker, pretraining.loop, finetuning.loop, training.checkpoint",
                     ("ray", "mlflow")) == []


def test_the_build_job_imports_without_torch():
    """The dataset build starts Ray and opens an MLflow run; neither may load torch (1.5 s of a 1 MB build's wall
    time on a 2-core box)."""
    assert loaded_by("jobs.build_dataset", ("torch",)) == []


def test_no_print_in_library_code():
    offenders = []
    for package in ("bert_core", "pipeline", "tracking", "training", "pretraining", "finetuning", "workflows"):
        for f in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    offenders.append(f"{f.relative_to(REPO)}:{node.lineno}")
    assert not offenders, "use logging in library code: " + ", ".join(offenders)


def _module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _our_imports(path: Path, known: set[str]) -> set[str]:
    """The modules of ours `path` imports, anywhere in the file (a function-level import is still a tie)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name.split(".")[0] in OURS:
                out.add(name)
    return out


def test_no_import_cycles():
    """A cycle is a shared type living in a consumer's file: move the type to a module of its own."""
    files = {_module_of(f): f for p in PACKAGES for f in (REPO / p).rglob("*.py")}
    graph = {m: _our_imports(f, set(files)) - {m} for m, f in files.items()}
    # A package's __init__ importing its own submodules is not a cycle of the code's meaning.
    graph = {m: {d for d in deps if not (files[m].name == "__init__.py" and d.startswith(m + "."))}
             for m, deps in graph.items()}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    import sys
    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, cycles


MAX_PACKAGE_LINES = 2600  # a package past this holds more than one concern (issue 25): split it


SUBPACKAGES = sorted({f.parent.relative_to(REPO).as_posix() for p in PACKAGES for f in (REPO / p).rglob("__init__.py")})


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_package_size(package):
    """Each package's own modules (a subpackage, e.g. pipeline/build/, counts on its own)."""
    lines = sum(len(f.read_text().splitlines()) for f in (REPO / package).glob("*.py"))
    assert lines <= MAX_PACKAGE_LINES, f"{package}/ has {lines} lines of Python (at most {MAX_PACKAGE_LINES})"


def test_the_build_job_reaches_no_trainer_module():
    assert loaded_by("jobs.build_dataset", ("training", "pretraining", "finetuning")) == []


def test_training_imports_nothing_from_the_build():
    """Ray's start-up is shared (pipeline/cluster/ray_start.py); the trainer reaches no module of the dataset build."""
    for f in (REPO / "training").rglob("*.py"):
        assert not any(n == "pipeline.build" or n.startswith("pipeline.build.")
                       for n in _our_imports(f, {"pipeline.build"} | {_module_of(g) for g in
                                                                       (REPO / "pipeline").rglob("*.py")})), f


def test_the_trainers_do_not_import_each_other():
    for package, other in (("pretraining", "finetuning"), ("finetuning", "pretraining")):
        for f in (REPO / package).rglob("*.py"):
            assert other not in imported_roots(f), f"{f.relative_to(REPO)} imports {other}"
