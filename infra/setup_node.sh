#!/usr/bin/env bash
# Installs this project on a Ray node (cluster launcher `setup_commands`, the Docker image build).
# Usage: infra/setup_node.sh cpu|gpu [PROJECT_DIR]
#   cpu: the CPU-only torch build (head and dataset-build nodes: ~200 MB instead of ~3 GB of CUDA libraries)
#   gpu: torch from PyPI, whose Linux wheels are the CUDA builds
# Versions come from constraints.txt, the same pins the README and CI use; Ray itself is pinned there too and
# must equal the Ray in the rayproject/ray image, which is checked at the end rather than silently replaced.
set -euo pipefail
kind="${1:?usage: setup_node.sh cpu|gpu [PROJECT_DIR]}"
root="${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
constraints="$root/constraints.txt"
torch_pin="$(grep -E '^torch==' "$constraints" | cut -d= -f3)"
case "$kind" in
  cpu) pip install -q "torch==${torch_pin}" --index-url https://download.pytorch.org/whl/cpu ;;
  gpu) ;;
  *) echo "setup_node.sh: kind must be cpu or gpu, got '$kind'" >&2; exit 2 ;;
esac
ray_before="$(python -c 'import ray; print(ray.__version__)' 2>/dev/null || echo none)"
pip install -q -c "$constraints" -e "$root"
ray_pin="$(grep -E '^ray==' "$constraints" | cut -d= -f3)"
ray_after="$(python -c 'import ray; print(ray.__version__)')"
if [ "$ray_after" != "$ray_pin" ] || { [ "$ray_before" != none ] && [ "$ray_before" != "$ray_pin" ]; }; then
  echo "setup_node.sh: the image has Ray $ray_before, constraints.txt pins $ray_pin: use rayproject/ray:${ray_pin}-py311-*" >&2
  exit 1
fi
python -c "import torch, bert_core, pipeline, jobs; print('bert-pretrain ready: torch', torch.__version__, 'cuda', torch.cuda.is_available())"
