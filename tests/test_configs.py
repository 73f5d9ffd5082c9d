"""Configs that explain themselves (CONVENTIONS.md § Config): every field of every dataclass in the library carries a
docstring (a string literal under it, torchtitan's style), wide configs are keyword-only, and a job's flag takes its
default from the field it sets instead of writing it again."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIBRARY = ("bert_core", "storage", "cluster", "corpus", "curate", "tracking", "pipeline", "training", "pretraining",
           "finetuning", "workflows", "jobs")
WIDE = 6  # a config with more fields than this is built by keyword only


def _is_dataclass(node: ast.ClassDef) -> ast.expr | None:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("dataclass", "marker"):  # pipeline.markers.marker declares a frozen dataclass
            return d
    return None


def _fields(node: ast.ClassDef):
    """(field name, documented) for each field of the class body, in order (ClassVar excluded)."""
    body = node.body
    for i, stmt in enumerate(body):
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        if "ClassVar" in ast.unparse(stmt.annotation):
            continue
        nxt = body[i + 1] if i + 1 < len(body) else None
        documented = (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                      and isinstance(nxt.value.value, str) and nxt.value.value.strip() != "")
        yield stmt.target.id, documented


def dataclasses_of_library():
    for package in LIBRARY:
        for f in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.ClassDef) and (deco := _is_dataclass(node)) is not None:
                    yield f.relative_to(REPO).as_posix(), node, deco


def test_every_dataclass_field_is_documented():
    missing, total = [], 0
    for rel, node, _ in dataclasses_of_library():
        for name, documented in _fields(node):
            total += 1
            if not documented:
                missing.append(f"{rel}:{node.name}.{name}")
    assert total > 500
    assert not missing, (f"{len(missing)} of {total} dataclass fields have no docstring (a string literal under the "
                         f"field: what it means, its unit, why its default): " + ", ".join(missing[:40]))


def test_wide_configs_are_keyword_only():
    narrow = []
    for rel, node, deco in dataclasses_of_library():
        if not node.name.endswith("Config") or sum(1 for _ in _fields(node)) <= WIDE:
            continue
        kw = isinstance(deco, ast.Call) and any(k.arg == "kw_only" and getattr(k.value, "value", False)
                                                 for k in deco.keywords)
        if not kw:
            narrow.append(f"{rel}:{node.name}")
    assert not narrow, f"configs with more than {WIDE} fields must be @dataclass(kw_only=True): {narrow}"
