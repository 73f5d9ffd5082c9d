#!/usr/bin/env bash
# Run the test suite in the project's virtualenv (created and installed on first use). Extra args go to pytest.
set -euo pipefail
source "$(dirname "$0")/_venv.sh" "[test]"
exec python -m pytest "$@"
