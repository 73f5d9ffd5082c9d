"""A job's flag declared from the dataclass field it sets: its default and its help text are the field's (the string
literal under the field, torchtitan's style), so neither is written twice (CONVENTIONS.md § Config)."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import textwrap
from typing import Any


def field_default(cls: type, name: str) -> Any:
    """The field's default, or what its default_factory makes (ValueError for a field without either)."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise ValueError(f"{cls.__name__}.{name} has no default for a flag to take")


@functools.cache
def _docstrings(cls: type) -> dict[str, str]:
    """The docstrings of the fields this class's own body declares, whitespace folded."""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    except (OSError, TypeError):  # a class without source (made at run time)
        return {}
    return {field.target.id: " ".join(doc.value.value.split())
            for field, doc in zip(body, body[1:], strict=False)
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
            and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
            and doc.value.value.strip()}


def field_help(cls: type, name: str) -> str:
    """The field's docstring, from the nearest class of the MRO that documents it (ValueError when none does: a
    flag must not go out without help)."""
    for klass in cls.__mro__:
        if doc := _docstrings(klass).get(name):
            return re.sub(r"``([^`]+)``", r"\1", doc)  # a docstring's code marks, plain in a terminal
    raise ValueError(f"{cls.__name__}.{name} has no docstring: write one under the field (what it means, its unit, "
                     "why its default), which its flag's --help shows")


def add_field(group: Any, flag: str, cls: type, name: str | None = None, *, help_suffix: str | None = None,
              **kwargs: Any) -> argparse.Action:
    """``group.add_argument(flag, ...)`` with the default and help of ``cls``'s field ``name`` (default: the flag's
    name, --max-seq-length -> max_seq_length). ``help_suffix``: what this job's flag adds to the field's meaning
    (which other flag it needs, how it reads), in argparse's help syntax (%% for %). A bool field whose default is
    False is a switch (store_true) unless an ``action`` is given; the other keywords go to add_argument as they are."""
    name = name or flag.removeprefix("--").replace("-", "_")
    default = field_default(cls, name)
    text = field_help(cls, name).replace("%", "%%")  # argparse formats help with %: the docstring's are literal
    if help_suffix:
        text = f"{text} {help_suffix}"
    if default is False and "action" not in kwargs:
        kwargs["action"] = "store_true"
    if kwargs.get("type") is float:  # no nan or inf reaches a config: refused here, naming the flag
        from jobs._common import finite

        kwargs["type"] = finite()
    return group.add_argument(flag, default=default, help=text, **kwargs)
