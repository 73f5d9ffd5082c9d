#!/usr/bin/env bash
# The whole pipeline on the bundled sample, on this machine: vocab -> dataset -> pre-train -> fine-tune -> MLflow.
set -euo pipefail
source "$(dirname "$0")/_venv.sh" ""
exec python jobs/workflow.py --config configs/quickstart.yaml "$@"
