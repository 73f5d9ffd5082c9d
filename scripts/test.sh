#!/usr/bin/env bash
# Run the test suite in the project's virtualenv (created and installed on first use). Extra args go to pytest.
#
# Three pytest processes (pytest-xdist), each file's tests in one of them (--dist loadfile: a module's fixtures, such
# as a job run several tests read, are made once), the longest files first (tests/conftest.py, LONGEST_FIRST). Much
# of the suite's time is waiting (Ray starting, jobs in subprocesses, leases going stale), so a third process helps
# even on a 2-core machine: the whole suite took 26.0 minutes with three against 29.6 with two, back to back on an
# idle 2-core box, 2026-11-28. BERT_TEST_WORKERS=N for another count; add `-n 0` to run in this process, with output
# shown as it happens.
set -euo pipefail
source "$(dirname "$0")/_venv.sh" "[test]"
exec python -m pytest -n "${BERT_TEST_WORKERS:-3}" --dist loadfile "$@"
