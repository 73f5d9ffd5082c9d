"""Before a job imports the project: is this Python the project's environment? Standard library only, so that
`python jobs/X.py` from a fresh shell (the system's python3, no venv) ends in one line saying how to enter it, not
in a `ModuleNotFoundError` traceback."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The project's dependencies a job imports first (import names; pyproject.toml lists the distributions).
NEEDED = ("numpy", "pyarrow", "fsspec", "tokenizers", "yaml", "mlflow", "ray", "torch")


def require_project_env(job_file: str) -> None:
    """Exit with status 2 and one line on stderr when this interpreter lacks the project's dependencies."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        return
    venv = REPO / ".venv"
    if (venv / "bin" / "python").exists():
        how = f"source {_shown(venv)}/bin/activate"
    else:
        how = (f"{_shown(REPO / 'scripts' / 'quickstart.sh')} (it creates .venv), then source "
               f"{_shown(venv)}/bin/activate")
    job = _shown(Path(job_file).resolve())
    sys.stderr.write(f"{job}: this Python ({sys.executable}) lacks the project's dependencies "
                     f"({', '.join(missing)}): run `{how}`, then `python {job} ...` again\n")
    raise SystemExit(2)


def _shown(path: Path) -> str:
    """Relative to the working directory when below it (what a person types there), else absolute."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel
