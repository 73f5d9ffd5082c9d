"""The linter the README's test command runs first (scripts/test.sh): ruff with at least the E, F, I, B and UP rule
sets, configured in pyproject.toml, clean on the whole tree. Here too, so that `pytest` alone also holds it."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_is_configured_with_the_house_rule_sets():
    text = (REPO / "pyproject.toml").read_text()  # tomllib is 3.11+; the project runs on 3.10 too
    lint = text.split("[tool.ruff.lint]", 1)[1].split("\n[", 1)[0]
    select = re.search(r"^select = \[(.*?)\]", lint, re.M | re.S).group(1)
    assert {"E", "F", "I", "B", "UP"} <= set(re.findall(r'"(\w+)"', select))
    assert "ignore" not in lint, "a rule ignored for the whole tree: fix the code, or noqa one line with its reason"


def test_ruff_check_is_clean():
    pinned = Path(sys.executable).parent / "ruff"  # the project's (constraints.txt), not another on PATH
    ruff = str(pinned) if pinned.exists() else shutil.which("ruff")
    assert ruff, "ruff is not installed: scripts/test.sh installs the [test] extra, which brings it"
    out = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]
