#!/usr/bin/env bash
# The peer venv for bench/peers/flower_emnist.py: Flower (its simulation extra: Ray) and the CPU torch this project
# runs, in bench/peers/.venv-flower (git-ignored), apart from the project's own venv so that Flower's pins never touch
# it. torch is pinned: the CPU build on this machine's disk (an unpinned torch would pull the CUDA wheels).
# Usage: bash bench/peers/setup_flower.sh [PYTHON]   (then: python bench/peers/flower_emnist.py --help)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${1:-python3.11}"
FLWR_VERSION="${FLWR_VERSION:-1.42.0}"  # the newest 1.4x release on PyPI when this was written
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"  # the project's torch (its CPU build)
"$python" -m venv "$here/.venv-flower"
"$here/.venv-flower/bin/python" -m pip install --quiet "flwr[simulation]==$FLWR_VERSION" "torch==$TORCH_VERSION" numpy
"$here/.venv-flower/bin/python" -c "import flwr, ray, torch; print('flwr', flwr.__version__, 'ray', ray.__version__, 'torch', torch.__version__)"
