"""The per-unit stages as pipelines over rows: a read of our own, operators over rows, a sink that commits units.

    ReadCorpus (docs.read_block: one read task per planned unit, a row per document with its stable id)
      -> [document filters] -> SplitTokenize (docs.py: sentences and WordPiece ids, per document)
      -> WriteDocs (read.py: each unit's tokenized documents committed atomically, then its marker)

    ReadDocs (instances.py: a unit's tokenized documents) -> CountPairs (rows per document pass, no rows made)
      -> WriteCounts (each unit's row counts, then its marker; the shard items make the rows: shards.py)

A ``RowStage`` names the units to read, the operators (picklable callables, ``pa.Table -> pa.Table``) and the sink
(``write(tables) -> markers``). ``pipeline.ray_data`` runs it as one Ray Data execution
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
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from corpus.readers import InputError, Unit
from pipeline.markers import Marker

# The packages whose ValueErrors are users' mistakes by our own words (and Python's own ValueError).
OURS = frozenset({"pipeline", "corpus", "curate", "storage", "builtins"})


def users_mistake(e: BaseException) -> bool:
    """Whether ``e`` is a user's mistake (an ``InputError``, or a ``ValueError`` raised by our code or Python's) rather
    than a fault: a library's ValueError subclass (a storage client's, say) is not one."""
    return isinstance(e, (InputError, ValueError)) and type(e).__module__.split(".")[0] in OURS


@dataclasses.dataclass(frozen=True)
class UserError:
    """A user's mistake (a bad input, a bad value) met in a worker, carried back as a value: through Ray's wrappers
    (RayTaskError, Ray Data's UserCodeException, whose cause is lost on the way) the user would get a stack trace
    instead of the one line that names the file and the fix."""

    kind: str
    """The exception to raise in the driver: ``"InputError"`` or ``"ValueError"``."""
    message: str
    """The one line the user reads: which file or value, what was wrong and the fix."""

    def raise_(self) -> None:
        raise (InputError if self.kind == "InputError" else ValueError)(self.message)


@dataclasses.dataclass(frozen=True)
class RowStage:
    """``units``: uid -> Unit, the uid naming the unit's marker; ``read``: the unit -> its block of rows;
    ``operators`` applied in order; ``sink`` commits (``write(tables) -> [Marker | UserError]``)."""

    name: str
    """The stage's name: its folder of markers in _work and its key in ``BuildState.markers``."""
    units: dict[str, Unit]
    """The units to run by uid, the uid naming the unit's marker, in the order their markers are returned."""
    read: Callable[[Unit], pa.Table]
    """A unit -> its block of rows, ending with the unit's report row (one read task per unit on Ray)."""
    operators: tuple[Callable[[pa.Table], pa.Table], ...]
    """Picklable callables over the rows, applied in order in the read task's process."""
    sink: Any
    """What commits each unit's rows: ``write(tables) -> [Marker | UserError]``."""
    marker: type[Marker]
    """The stage's marker type: how committed markers are read back on resume."""
    sizes: dict[str, int] | None = None
    """Bytes of text per uid, for the progress lines' MB/s and ETA; None: units counted only."""
    noun: str = "units"
    """What the progress lines call the units."""
    after: Callable[[Any], Any] | None = None
    """The stage's hook (``executor.Stage.after`` says what for: it returns the next state); None: later stages
    need only the markers."""
    source: Any = None
    """A user's ray.data.Dataset streamed through the operators instead of ``read`` over ``units``: the sink's
    results are the stage's, and the pass always runs (what it read is only known by reading it); None: units."""

    def setup(self) -> None:
        """Load what the operators keep per process (the tokenizer, the pool): the warm-up runs it."""
        for op in self.operators:
            if hasattr(op, "setup"):
                op.setup()


# --- Per-operator statistics: rows in and out, bytes out, CPU and wall seconds of every operator (the read and the
# sink included) in this process since the sink last took them. Ray Data fuses a pass into one task per unit, so its
# own statistics show the chain as one operator; these are per operator, carried by the unit's marker (``ops``) to
# the driver, its progress lines and the build's MLflow run. The plain loop counts the same way.
_OPS: dict[str, list[float]] = {}


def count(name: str, rows_in: int, rows_out: int, nbytes: int, cpu_s: float, wall_s: float) -> None:
    row = _OPS.setdefault(name, [0, 0, 0, 0.0, 0.0])
    for i, v in enumerate((rows_in, rows_out, nbytes, cpu_s, wall_s)):
        row[i] += v


def take_ops() -> dict[str, tuple[float, ...]]:
    """The operators' statistics since the last call (``count``), as a marker keeps them: (rows in, rows out,
    bytes out, CPU seconds, wall seconds) by operator."""
    out = {k: (int(v[0]), int(v[1]), int(v[2]), round(v[3], 4), round(v[4], 4)) for k, v in _OPS.items()}
    _OPS.clear()
    return out


class Measured:
    """An operator (or a read) whose calls are counted (``count``); ``measured`` names it after the operator."""

    def __init__(self, fn: Callable[[Any], pa.Table]):
        self.fn = fn

    def __getattr__(self, name: str) -> Any:  # setup() and the rest pass through
        if "fn" not in self.__dict__:  # unpickling: nothing to pass through yet
            raise AttributeError(name)
        return getattr(self.__dict__["fn"], name)

    def __call__(self, arg: Any) -> pa.Table:
        t0, c0 = time.perf_counter(), time.thread_time()
        out = self.fn(arg)
        count(type(self).__name__, arg.num_rows if isinstance(arg, pa.Table) else 0, out.num_rows, out.nbytes,
              time.thread_time() - c0, time.perf_counter() - t0)
        return out


def measured(fn: Callable[[Any], pa.Table]) -> Measured:
    return type(type(fn).__name__, (Measured,), {})(fn)


def sum_ops(markers: Sequence[Any]) -> dict[str, tuple[float, ...]]:
    """A stage's operators' statistics: its markers' ``ops`` added up."""
    total: dict[str, list[float]] = {}
    for m in markers:
        for k, v in (getattr(m, "ops", None) or {}).items():
            row = total.setdefault(k, [0, 0, 0, 0.0, 0.0])
            for i, x in enumerate(v):
                row[i] += x
    return {k: tuple(v) for k, v in total.items()}


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
