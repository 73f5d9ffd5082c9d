"""The import rules of CONVENTIONS.md and docs/architecture.md, as allowed imports (not forbidden ones):

    jobs -> workflows -> pretraining, finetuning -> training -> tracking -> corpus -> storage
    jobs -> pipeline -> curate -> corpus -> storage;  pipeline, training -> cluster
    bert_core beside them, importing only torch (and safetensors, NumPy)

storage and cluster import only themselves; corpus imports storage; the two trainers never import each other;
tracking/ does not import the build (the build hands its callback what it reports); MLflow is imported only under
tracking/; Ray only in its named homes: cluster/ (start-up), the build's Ray Data engine (pipeline/ray_data/),
curation's Ray adapter (curate/ray_*.py) and training's launcher and its rendezvous (training/launch.py,
training/rendezvous.py). No top-level package holds more than 30% of the library's lines."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Which of our packages each package may import (itself included): the allowed list, not a forbidden one.
ALLOWED = {
    "bert_core": {"bert_core"},
    "storage": {"storage"},
    "cluster": {"cluster"},
    "corpus": {"corpus", "storage"},
    "curate": {"curate", "corpus", "storage"},
    "tracking": {"tracking", "corpus", "storage"},
    "pipeline": {"pipeline", "curate", "corpus", "storage", "cluster"},
    "training": {"training", "tracking", "corpus", "storage", "cluster", "bert_core"},
    "pretraining": {"pretraining", "training", "tracking", "corpus", "storage", "bert_core"},
    "finetuning": {"finetuning", "training", "tracking", "corpus", "storage", "bert_core"},
    "workflows": {"workflows", "training", "tracking", "corpus", "storage"},
    "jobs": {"jobs", "workflows", "pretraining", "finetuning", "training", "tracking", "pipeline", "curate", "corpus",
             "storage", "cluster", "bert_core"},
}
OURS = set(ALLOWED)
PACKAGES = sorted(ALLOWED)
# Where Ray may be imported: one home per concern.
RAY_HOMES = ("cluster/", "pipeline/ray_data/", "curate/ray_", "training/launch.py", "training/rendezvous.py")


def may_import(module: str, rel: str) -> bool:
    """MLflow only under tracking/; Ray only in its homes (RAY_HOMES); no storage library in the model."""
    if module == "mlflow":
        return rel.startswith("tracking/")
    if module == "ray":
        return rel.startswith(RAY_HOMES)
    if module in ("fsspec", "pyarrow", "s3fs"):
        return not rel.startswith("bert_core/")
    return True


def test_every_package_is_named_here():
    """A new top-level folder of Python code is a package the rules must speak of (with its docstring)."""
    found = {d.name for d in REPO.iterdir() if d.is_dir() and any(d.glob("*.py"))} - {"tests", "benchmarks",
                                                                                        "scripts", "infra"}
    assert found == OURS


@pytest.mark.parametrize("package", sorted({f.parent.relative_to(REPO).as_posix() for p in ALLOWED
                                            for f in (REPO / p).rglob("*.py")}))
def test_every_package_says_what_it_is(package):
    init = REPO / package / "__init__.py"
    assert init.exists(), f"{package}/ has no __init__.py: add one whose docstring says what the package is"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and len(doc.split()) >= 8, f"{init.relative_to(REPO)}: its docstring should say what {package}/ is"


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
    for package in set(PACKAGES) - {"jobs"}:
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


MAX_SHARE = 0.30  # a package past this holds more than one concern (issue 40): split it


def _lines(folder: Path) -> int:
    return sum(len(f.read_text().splitlines()) for f in folder.rglob("*.py"))


def test_no_package_holds_more_than_its_share():
    """Each top-level package with all its sub-folders, against the whole library (folders without __init__.py
    count: they are found by their .py files)."""
    sizes = {p: _lines(REPO / p) for p in PACKAGES}
    total = sum(sizes.values())
    over = {p: f"{n / total:.0%}" for p, n in sizes.items() if n > MAX_SHARE * total}
    assert not over, f"packages over {MAX_SHARE:.0%} of the library's {total} lines: {over}"


def test_the_build_job_reaches_no_trainer_module():
    assert loaded_by("jobs.build_dataset", ("training", "pretraining", "finetuning")) == []


def test_the_build_job_imports_no_trainer_even_lazily():
    """Function-level imports too: nothing of the build job's files, nor of the packages it uses, names a trainer."""
    for package in ("pipeline", "curate", "corpus", "storage", "cluster", "tracking"):
        for f in (REPO / package).rglob("*.py"):
            assert not imported_roots(f) & {"training", "pretraining", "finetuning"}, f.relative_to(REPO)


def test_the_trainers_do_not_import_each_other():
    for package, other in (("pretraining", "finetuning"), ("finetuning", "pretraining")):
        for f in (REPO / package).rglob("*.py"):
            assert other not in imported_roots(f), f"{f.relative_to(REPO)} imports {other}"


def test_the_architecture_doc_states_these_rules():
    """docs/architecture.md's list of who may import whom is this file's ALLOWED, package for package."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("## Where code lives", 1)[1].split("```", 2)[1]
    stated = {}
    for line in block.strip().splitlines():
        names, _, rest = line.partition("->")
        if rest:
            stated[names.strip().rstrip("/")] = {p.strip() for p in rest.split("(")[0].split(",")}
        elif "import nothing of ours" in line:
            stated.update({p.strip().rstrip("/"): set() for p in line.split("import")[0].split(",")})
    stated["jobs"] = set(ALLOWED) - {"jobs"}
    assert stated == {p: a - {p} for p, a in ALLOWED.items()}
