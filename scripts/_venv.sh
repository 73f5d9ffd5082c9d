# Sourced by scripts/quickstart.sh and scripts/test.sh: create or reuse a virtualenv and install this project
# with the pinned versions in constraints.txt. Re-installs only when pyproject.toml or the constraints change.
#   VENV=path            virtualenv to use (default: .venv in the repository)
#   BERT_CONSTRAINTS=f   another constraints file (e.g. a CUDA torch build on a GPU machine); empty = no pins
set -euo pipefail
extras="${1:-}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"
constraints="${BERT_CONSTRAINTS-$root/constraints.txt}"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "error: Python 3.10+ is needed ($py is $("$py" --version 2>&1)); set PYTHON=/path/to/python3.x" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  echo ">> creating virtualenv $venv"
  "$py" -m venv "$venv"
fi
stamp="$venv/.bert-pretrain-installed$extras"
want="$(cat "$root/pyproject.toml" ${constraints:+"$constraints"} | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo ">> installing bert-pretrain$extras into $venv (pinned by ${constraints:-nothing}; first time takes a few minutes)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q ${constraints:+-c "$constraints"} -e "$root$extras"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
# Every Ray listener on loopback: Ray otherwise advertises the external interface (see docs/local.md).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="${RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER:-0}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
cd "$root"
