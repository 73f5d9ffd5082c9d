#!/usr/bin/env bash
# Lint the tree (ruff) and run the test suite in the project's virtualenv (created and installed on first use).
# Extra args go to pytest.
#
# Two pytest processes (pytest-xdist), each file's tests in one of them (--dist loadfile: a module's fixtures, such as
# a job run several tests read, are made once). Most of the suite's time is one busy core (interpreters importing
# torch, Ray and MLflow; Ray starting; jobs in subprocesses), so two processes nearly halve it on a 2-core machine:
# pytest took 14.3-15.0 minutes with two against 25.5 in one (CI's run of the same suite), 2026-11-26; the suite has
# grown since: 22.3-32.7 minutes with two, 2026-11-28 (by the hour), 41.3 on 2026-12-06 (README). Three took 26.0 on
# 2026-11-28, but in a fresh clone's run
# two load-sensitive tests failed under three (a workflow whose 5 s lease starved, a second Ray that did not start).
# BERT_TEST_WORKERS=N for another count; add `-n 0` to run in this process, with output shown as it happens.
set -euo pipefail
source "$(dirname "$0")/_venv.sh" "[test]"
# The linter first (seconds): ruff's E, F, I, B and UP rules over the whole tree, configured in pyproject.toml.
ruff check .
exec python -m pytest -n "${BERT_TEST_WORKERS:-2}" --dist loadfile "$@"
