"""The per-unit stages as pipelines over rows: a read of our own, operators over rows, a sink that commits units.

    ReadCorpus (docs.read_block: one read task per planned unit, a row per document with its stable id)
      -> [document filters] -> SplitTokenize (docs.py: sentences and WordPiece ids, per document)
      -> WriteDocs (read.py: each unit's tokenized documents committed atomically, then its marker)

    ReadDocs (instances.py: a unit's tokenized documents) -> PairsAndMasks (NSP pairs and MLM masks; the
      random-next pool handed over as a shared object) -> WriteUnits (each unit's instances, then its marker)

A ``RowStage`` names the units to read, the operators (picklable callables, ``pa.Table -> pa.Table``) and the sink
(``write(tables) -> markers``). ``pipeline.build.ray_data`` runs it as one Ray Data execution
(``read_datasource -> map_batches ... -> write_datasink``); ``LocalExecutor`` runs the very same callables in a
loop, unit by unit. Every unit's rows end with its report row (``docs.read_block``), so a sink knows what the
reader saw of the unit even when no document reached it, and can tell that it holds all of the unit's rows.

Why the unit, not the row, is what commits: the shards' global order is fixed per (unit, pass) (``shards.py``), so
a unit's instances are written in document order as one file with one marker, as in the stage-by-stage build;
every operator runs in the read task's process (Ray Data fuses the chain: same compute, same resources), so a
unit's rows never leave that process before they are committed.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.build.markers import Marker
from pipeline.readers import InputError, Unit


def users_mistake(e: BaseException) -> bool:
    """Whether ``e`` is a user's mistake (an ``InputError``, or a ``ValueError`` raised by our code or Python's) rather
    than a fault: a library's ValueError subclass (a storage client's, say) is not one."""
    return isinstance(e, (InputError, ValueError)) and type(e).__module__.startswith(("pipeline", "builtins"))


@dataclasses.dataclass(frozen=True)
class UserError:
    """A user's mistake (a bad input, a bad value) met in a worker, carried back as a value: through Ray's wrappers
    (RayTaskError, Ray Data's UserCodeException, whose cause is lost on the way) the user would get a stack trace
    instead of the one line that names the file and the fix."""

    kind: str  # "InputError" | "ValueError"
    message: str

    def raise_(self) -> None:
        raise (InputError if self.kind == "InputError" else ValueError)(self.message)


@dataclasses.dataclass(frozen=True)
class RowStage:
    """``units``: uid -> Unit, the uid naming the unit's marker; ``read``: the unit -> its block of rows;
    ``operators`` applied in order; ``sink`` commits (``write(tables) -> [Marker | UserError]``)."""

    name: str
    units: dict[str, Unit]
    read: Callable[[Unit], pa.Table]
    operators: tuple[Callable[[pa.Table], pa.Table], ...]
    sink: Any
    marker: type[Marker]
    sizes: dict[str, int] | None = None
    noun: str = "units"
    after: Callable[[Any], None] | None = None  # the stage's hook (executor.Stage says what for)

    def setup(self) -> None:
        """Load what the operators keep per process (the tokenizer, the pool): the warm-up runs it."""
        for op in self.operators:
            if hasattr(op, "setup"):
                op.setup()


def by_unit(tables: Sequence[pa.Table]) -> list[tuple[str, pa.Table]]:
    """The rows of ``tables`` grouped by unit, each unit's rows in the order they came, units in uid order."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return []
    table = pa.concat_tables(tables, promote_options="default")
    units = table.column("unit")
    return [(u, table.filter(pc.equal(units, u))) for u in sorted(set(units.to_pylist()))]


def user_error(report: dict[str, Any]) -> UserError | None:
    return UserError(*report["error"]) if "error" in report else None
