"""A job's flag takes its default and help from the dataclass field it sets (jobs/_fields.py), so no default is
written twice: no `add_argument(..., default=X)` where X is the default of the field that flag's value goes into
(found by following the flag into the dataclasses the file builds), and `--help` shows the fields' docstrings."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from corpus.create_instances import InstanceConfig
from corpus.readers import ReadOptions
from curate import DedupConfig
from finetuning.schedule import ScheduleConfig
from jobs._fields import add_field, field_default, field_help
from pipeline.vocab import VocabContext
from pretraining.config import OptimizerConfig
from training.launch import LaunchConfig

REPO = Path(__file__).resolve().parents[2]
FLAG_FILES = sorted(REPO.glob("jobs/*.py")) + [REPO / "pretraining" / "batches.py"]
ARGS = {"a", "args"}  # the parsed flags' names in the jobs
# A converted flag per job, whose field's docstring its --help must show.
SHOWN = {
    "build_dataset": [("--max-seq-length", InstanceConfig, "max_seq_length"), ("--format", ReadOptions, "fmt"),
                      ("--dedup-threshold", DedupConfig, "threshold")],
    "train_tokenizer": [("--min-frequency", VocabContext, "min_frequency")],
    "pretrain": [("--weight-decay", OptimizerConfig, "weight_decay"), ("--storage", LaunchConfig, "storage")],
    "finetune": [("--eval-batch-size", ScheduleConfig, "eval_batch_size")],
}


def _module(path: Path):
    return importlib.import_module(path.relative_to(REPO).with_suffix("").as_posix().replace("/", "."))


def _resolve(node: ast.expr, scope: dict):
    """The object a name or dotted name in the module stands for (None for anything else)."""
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_resolve(node.value, scope), node.attr, None)
    return None


def _dests(node: ast.AST, tainted: dict[str, set[str]], calls: bool = True) -> set[str]:
    """The flags (dest names) an expression reads: `a.<dest>`, `args.<dest>`, or a local holding one; `calls`:
    also those a call reads (a field's value may be the flag's, converted: `lr_or_default(a.lr, ...)`)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ARGS:
        return {node.attr}
    if isinstance(node, ast.Name):
        return set(tainted.get(node.id, ()))
    if isinstance(node, ast.Call) and not calls:
        return set()
    return set().union(*(_dests(n, tainted, calls) for n in ast.iter_child_nodes(node)))


def fields_set(tree: ast.Module, scope: dict) -> dict[str, set[tuple[type, str]]]:
    """dest -> the (dataclass, field) its value goes into, by keyword or position, in the calls of this file
    (through locals holding a flag's value too: `fewest, most = a.num_workers ...`; not through what a call makes
    of it, `micro, accum = plan_for_workers(...)`)."""
    tainted: dict[str, set[str]] = {}
    for _ in range(3):  # locals computed from locals
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for name in (n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                    tainted.setdefault(name, set()).update(_dests(node.value, tainted, calls=False))
    out: dict[str, set[tuple[type, str]]] = {}
    for node in ast.walk(tree):
        cls = _resolve(node.func, scope) if isinstance(node, ast.Call) else None
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            continue
        positional = [f.name for f in dataclasses.fields(cls) if f.init and not f.kw_only]
        given = list(zip(positional, node.args, strict=False)) + [(k.arg, k.value) for k in node.keywords if k.arg]
        for field, value in given:
            for dest in _dests(value, tainted):
                out.setdefault(dest, set()).add((cls, field))
    return out


def _dest(call: ast.Call) -> str | None:
    for k in call.keywords:
        if k.arg == "dest":
            return ast.literal_eval(k.value)
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
    return flags[0][2:].replace("-", "_") if flags else None


def _same(a, b) -> bool:
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def repeated_defaults(path: Path) -> list[str]:
    """`file: --flag default=X repeats Class.field` for each add_argument whose default is its field's."""
    module = _module(path)
    scope = vars(module)
    tree = ast.parse(path.read_text(), str(path))
    sets = fields_set(tree, scope)
    found = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_argument"):
            continue
        default = next((k.value for k in call.keywords if k.arg == "default"), None)
        dest = _dest(call)
        if default is None or dest is None:
            continue
        try:  # a literal, a constant or `Config.field`; anything else is not a default written here
            value = eval(compile(ast.Expression(default), str(path), "eval"), dict(scope))
        except Exception:  # noqa: BLE001 - a local or a call: the check speaks of defaults spelled out
            continue
        for cls, field in sorted(sets.get(dest, ()), key=lambda cf: (cf[0].__name__, cf[1])):
            try:
                if _same(value, field_default(cls, field)):
                    found.append(f"{path.relative_to(REPO)}:{call.lineno}: --{dest.replace('_', '-')} "
                                 f"default={ast.unparse(default)} repeats {cls.__name__}.{field}")
            except ValueError:  # a required field: nothing to repeat
                pass
    return found


def test_no_flag_repeats_the_default_of_the_field_it_sets():
    found = [line for path in FLAG_FILES for line in repeated_defaults(path)]
    assert not found, ("declare these flags with jobs._fields.add_field (the default and help come from the field), "
                       "or say why the flag's default differs:\n" + "\n".join(found))


def _help_of(job: str, monkeypatch) -> str:
    seen = []
    parse = argparse.ArgumentParser.parse_args
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args",
                        lambda self, *a, **k: seen.append(self) or parse(self, *a, **k))
    with pytest.raises(SystemExit):
        importlib.import_module(f"jobs.{job}").parse_args(["--help"])
    return seen[0].format_help()


@pytest.mark.parametrize("job", sorted(SHOWN))
def test_help_shows_the_fields_docstrings(job, monkeypatch, capsys):
    text = re.sub(r"\s+", "", _help_of(job, monkeypatch))  # argparse wraps lines, also at hyphens
    capsys.readouterr()
    for flag, cls, name in SHOWN[job]:
        assert re.sub(r"\s+", "", field_help(cls, name)) in text, (flag, field_help(cls, name))


@dataclasses.dataclass(frozen=True)
class _Example:
    documented: int = 3
    """Rows per widget (a documented field)."""
    switch: bool = False
    """Turns the widget on."""
    undocumented: float = 0.5
    listed: tuple[int, ...] = dataclasses.field(default_factory=lambda: (1, 2))
    """Widths: 50% of them at least."""


def test_add_field_takes_the_default_and_the_docstring():
    p = argparse.ArgumentParser()
    add_field(p, "--documented", _Example, type=int, help_suffix="(with --switch)")
    add_field(p, "--switch", _Example)
    add_field(p, "--widths", _Example, "listed")
    help_of = {a.dest: a.help for a in p._actions}
    assert help_of["documented"] == "Rows per widget (a documented field). (with --switch)"
    assert help_of["widths"] == "Widths: 50%% of them at least."  # escaped for argparse
    assert p.parse_args([]) == argparse.Namespace(documented=3, switch=False, widths=(1, 2))
    assert p.parse_args(["--switch", "--documented", "4"]).documented == 4
    assert "50% of them" in p.format_help()


def test_add_field_refuses_a_field_without_docstring():
    with pytest.raises(ValueError, match="undocumented has no docstring"):
        add_field(argparse.ArgumentParser(), "--undocumented", _Example, type=float)
