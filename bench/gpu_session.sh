#!/usr/bin/env bash
# One GPU session, prepared: the checks that need CUDA, run from the repository root on a bare GPU machine reachable
# only by copying the tree (x86-64, Python 3.12 with a CUDA build of torch and the common scientific packages, no
# network), in under ~8 minutes, everything's output kept under $OUT (at most 8 files: summary.txt, a log per step,
# gallery.csv):
#
#   here, first:   bash bench/gpu_session.sh --fetch-wheels
#                  packs what fedbench needs and that machine lacks (Ray, MLflow, Optuna, pydantic, ... pinned to the
#                  versions of this checkout's venv) into .whl/site.tar.xz, and the EMNIST sample that the EMNIST-62
#                  run reads into .gpu_data/ (both git-ignored through .git/info/exclude); prints what will travel
#                  against the 64 MiB a copy of the tree may hold.
#   there:         bash bench/gpu_session.sh        (the command; carry .whl and .gpu_data; give it 540 s)
#   back here:     python bench/gallery.py --merge OUT/gallery.csv && python bench/gallery.py --write-headers
#   dry, here:     FEDBENCH_GPU_SESSION_DRY=1 bash bench/gpu_session.sh
#                  every step briefly on the CPU (output under ./gpu_session_out unless OUT is set), so that the script
#                  is known to work apart from CUDA.
# Variables: PYTHON, the interpreter (--fetch-wheels: the venv whose versions are pinned, default .venv/bin/python;
# the session: default python3), GPU_PYTHON_VERSION (3.12: what the pack is built for), FEDBENCH_GPU_SITE (/tmp/site:
# where the session unpacks it), FEDBENCH_DATA (--fetch-wheels: the data root, default ../shared/data).
#
# Why a packed site and not the wheels: Ray's wheel alone (ray 2.60.0, cp312 manylinux) is 79 MB, over the 64 MiB a
# copy may hold. Installed here for that machine's Python (pip install --target --platform), without Ray's Java jars
# (its cross-language workers) and its dashboard's source maps, and packed with xz, Ray and everything else fit in
# 43 MB (2026-11-28: with the EMNIST sample, 9 MB, and the tree, 3 MB, 55 MB travel). Without the pack the session
# degrades: the engine's benches run, and the sweeps only where Ray, MLflow, Optuna and pydantic import
# (tests/test_gpu.py needs pydantic too, for the recipe code it imports).
#
# Steps and their limits (seconds): the environment and unpacking 30, tests/test_gpu.py 90, bench/clients_batched.py
# --device cuda 30, bench/runs_batched.py --device cuda 50, bench/gallery.py --device cuda: the Lasso sweep
# papers/bao2022_lasso at full size 80, papers/bao2022_emnist62 shortened to 200 and 400 of its 75,000 rounds 140,
# and bench/gallery.py --device cpu on the machine's cores: the Lasso sweep at full size 60; bench/deep_layouts.py
# --device cuda on Reddi et al.'s EMNIST CNN (the shipped FEMNIST sample's writers) at S = 10 and 50, 40: 520 s in all.
# Its table (OUT/deep_layouts.json, the repository's with the cuda rows added) replaces fedbench/networks/deep_layouts.json
# back here.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SELF")/.."

FETCH_PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
GPU_PYTHON_VERSION="${GPU_PYTHON_VERSION:-3.12}"  # that machine's Python (its image: 3.12.3)
LIMIT_BYTES=$((64 * 1024 * 1024))

# The packages of that machine's image that fedbench's dependencies use (its package list, 2026-11): not carried.
# Typer and its click are carried all the same: the CLI is written against typer >= 0.12 (whose recent releases need
# pydantic, which the image lacks), and the image's versions are not known.
ON_GPU_IMAGE="aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer cloudpickle
contourpy cycler filelock fonttools frozenlist fsspec h11 h5py idna jinja2 joblib kiwisolver markdown-it-py markupsafe
matplotlib mdurl msgpack multidict narwhals numpy packaging pandas pillow propcache protobuf psutil pyarrow pygments
pyparsing python-dateutil pyyaml requests rich scikit-learn scipy shellingham six threadpoolctl torch tqdm
typing-extensions urllib3 werkzeug yarl zipp"

# What fedbench needs that the image lacks, pinned to this venv's versions: the dependencies of pyproject.toml's
# [project] (mlflow as mlflow-skinny: the tracking client and its SQL store, without the UI server's web files), each
# with the requirements its installed metadata declares for that Python on x86-64 Linux, less the image's packages.
pinned_requirements() {
  ON_GPU_IMAGE="$ON_GPU_IMAGE" GPU_PYTHON_VERSION="$GPU_PYTHON_VERSION" "$FETCH_PYTHON" - <<'EOF'
import importlib.metadata as metadata
import os
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

version = os.environ["GPU_PYTHON_VERSION"]
target = {"python_version": version, "python_full_version": f"{version}.0", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython"}
present = {canonicalize_name(name) for name in os.environ["ON_GPU_IMAGE"].split()}
with open("pyproject.toml", "rb") as file:
    roots = [Requirement(text) for text in tomllib.load(file)["project"]["dependencies"]]
for root in roots:
    if canonicalize_name(root.name) == "mlflow":
        root.name = "mlflow-skinny"
extras: dict[str, set[str]] = {}
todo = list(roots)
while todo:
    requirement = todo.pop()
    name = canonicalize_name(requirement.name)
    if name in extras and set(requirement.extras) <= extras[name]:
        continue
    extras[name] = extras.get(name, set()) | set(requirement.extras)
    if name in present:  # the image's own, with what it needs (torch's sympy, networkx, ...)
        continue
    for text in metadata.requires(name) or []:
        needed = Requirement(text)
        if needed.marker is None or any(needed.marker.evaluate({**target, "extra": extra})
                                        for extra in extras[name] | {""}):
            todo.append(needed)
for name in sorted(set(extras) - present):
    print(f"{name}=={metadata.version(name)}")
EOF
}

fetch_wheels() {
  local exclude data tree carried
  stage="$(mktemp -d)"  # global: the trap runs after the function has returned
  trap 'rm -rf "$stage"' EXIT
  exclude="$(git rev-parse --git-path info/exclude)"
  mkdir -p "$(dirname "$exclude")" .whl .gpu_data/femnist
  for ignored in /.whl/ /.gpu_data/ /gpu_session_out/; do
    grep -qxF "$ignored" "$exclude" 2>/dev/null || echo "$ignored" >>"$exclude"
  done
  local platforms=(--python-version "$GPU_PYTHON_VERSION" --implementation cp --only-binary=:all:)
  for n in 39 35 34 31 28 27 24 17 5; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

  pinned_requirements >"$stage/requirements.txt"
  echo "carried for Python $GPU_PYTHON_VERSION: $(tr '\n' ' ' <"$stage/requirements.txt")"
  "$FETCH_PYTHON" -m pip download -q --no-deps "${platforms[@]}" -d "$stage/wheels" -r "$stage/requirements.txt"
  echo "wheels: $(du -cb "$stage"/wheels/*.whl | tail -1 | cut -f1) bytes; the largest:"
  ls -S -l "$stage"/wheels/*.whl | head -3 | awk '{print "  " $5, $9}' | sed "s|$stage/wheels/||"
  "$FETCH_PYTHON" -m pip install -q --no-deps --no-compile "${platforms[@]}" --target "$stage/site" \
    "$stage"/wheels/*.whl
  # Not needed to run: Ray's Java jars (cross-language workers) and its dashboard's source maps, the console scripts
  # (their first line names this machine's Python), bytecode.
  rm -rf "$stage/site/ray/jars" "$stage/site/bin"
  find "$stage/site" \( -name '*.js.map' -o -name '__pycache__' \) -prune -exec rm -rf {} +
  cp "$stage/requirements.txt" .whl/requirements.txt
  echo "packing $(du -sb "$stage/site" | cut -f1) bytes with xz (a minute or two)"
  tar -C "$stage/site" -cf - . | xz -9 -T0 >.whl/site.tar.xz

  data="${FEDBENCH_DATA:-../shared/data}"
  install -m 644 "$data/femnist/femnist_sample10.npz" "$data/femnist/SOURCE.md" .gpu_data/femnist/

  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
         | awk '{s += $1} END {print s + 0}')
  carried=$(du -cb .whl .gpu_data | tail -1 | cut -f1)
  echo ".whl: $(du -sb .whl | cut -f1) bytes, .gpu_data: $(du -sb .gpu_data | cut -f1) bytes, the tree itself:" \
       "$tree bytes; together $((tree + carried)) of the $LIMIT_BYTES a copy may hold"
  if (( tree + carried > LIMIT_BYTES )); then
    echo "over the limit: the copy would be refused" >&2
    exit 1
  fi
}

# -- the session (on the GPU machine, or dry here) ------------------------------------------------------------------

environment() {  # the machine, and the pack unpacked into $SITE (exported by `session`)
  echo "dry: $DRY, python: $("$PYTHON_BIN" -V 2>&1), cores: $(nproc)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
  if [ -f .whl/site.tar.xz ]; then
    mkdir -p "$SITE"
    "$PYTHON_BIN" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" .whl/site.tar.xz "$SITE"
    echo "unpacked .whl/site.tar.xz into $SITE ($(du -sh "$SITE" | cut -f1))"
  else
    echo "no .whl/site.tar.xz: nothing unpacked (bash bench/gpu_session.sh --fetch-wheels makes it)"
  fi
  ls -l .gpu_data/femnist 2>&1
  "$PYTHON_BIN" - <<'EOF'
import importlib

import torch

print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
for name in ("pydantic", "ray", "mlflow", "optuna", "sqlalchemy", "fedbench", "sweeps"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", ""), module.__file__)
    except Exception as error:  # a line per package, whatever breaks its import
        print(name, "does not import:", type(error).__name__, error)
EOF
}

session() {
  local dry="${FEDBENCH_GPU_SESSION_DRY:-0}"
  local out="${OUT:-$PWD/gpu_session_out}"
  local python="${PYTHON:-python3}"
  mkdir -p "$out"
  local summary="$out/summary.txt"
  : >"$summary"
  export DRY="$dry" PYTHON_BIN="$python" SITE="${FEDBENCH_GPU_SITE:-/tmp/site}"
  export PYTHONUNBUFFERED=1 FEDBENCH_DATA="$PWD/.gpu_data" PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

  # step NAME LIMIT COMMAND...: the command under `timeout`, its output (stdout and stderr) into NAME.log, its exit
  # status and seconds into the summary; a failing step does not stop the session.
  step() {
    local name="$1" limit="$2"
    shift 2
    local start=$SECONDS rc=0 outcome=ok
    echo "== $* (limit ${limit} s)" | tee -a "$out/$name.log"
    timeout -k 5 "$limit" "$@" >>"$out/$name.log" 2>&1 || rc=$?
    tail -n 30 "$out/$name.log"
    if (( rc == 124 || rc == 137 )); then
      outcome="timed out"
    elif (( rc != 0 )); then
      outcome="failed (exit $rc)"
    fi
    printf '%-16s %-16s %4d s  %s\n' "$name" "$outcome" $((SECONDS - start)) "$*" | tee -a "$summary"
  }

  # Dry: the same steps at toy sizes on the CPU (tests/test_gpu.py skips without CUDA), bao2022_emnist62_cpu for
  # bao2022_emnist62 (the same data file), each limit three times as long (a shared machine).
  local scale=1 device=(--device cuda) lasso_factor=(--factor 1) emnist=papers/bao2022_emnist62
  local sizes=() cases=()
  if [ "$dry" = 1 ]; then
    scale=3 device=(--device cpu) lasso_factor=(--factor 50) emnist=papers/bao2022_emnist62_cpu
    sizes=(--rounds 2 --repeats 1) cases=(--sizes 1 2 --repeats 1 --cases fedmid)
  else
    cases=(--repeats 2)
  fi
  step environment $((30 * scale)) bash "$SELF" --environment
  step test_gpu $((90 * scale)) "$python" -m pytest -q -p no:cacheprovider tests/test_gpu.py
  step clients_batched $((30 * scale)) "$python" bench/clients_batched.py "${device[@]}" "${sizes[@]}"
  step runs_batched $((50 * scale)) "$python" bench/runs_batched.py "${device[@]}" "${cases[@]}"
  cp fedbench/networks/deep_layouts.json "$out/deep_layouts.json"
  for clients in 10 50; do
    step deep_layouts $((20 * scale)) "$python" bench/deep_layouts.py "${device[@]}" --cases emnist_cnn-femnist \
      --batch-sizes 20 --clients "$clients" --repeats 3 --rounds 1 --write "$out/deep_layouts.json"
  done

  if "$python" -c "import ray, mlflow, optuna, pydantic" 2>/dev/null; then
    local note="GPU session: one GPU, $(nproc) CPU cores"
    [ "$dry" = 1 ] && note="dry run"
    local gallery=("$python" bench/gallery.py --out "$out/gallery.csv" --note "$note")
    step gallery $((80 * scale)) "${gallery[@]}" "${device[@]}" "${lasso_factor[@]}" --only papers/bao2022_lasso
    step gallery $((140 * scale)) "${gallery[@]}" "${device[@]}" --factor 200 --only "$emnist"
    step gallery_cpu $((60 * scale)) "${gallery[@]}" --device cpu "${lasso_factor[@]}" --only papers/bao2022_lasso
  else
    echo "sweeps           skipped          Ray, MLflow, Optuna or pydantic does not import (environment.log)" \
      | tee -a "$summary"
  fi
  echo "summary: $summary"
}

case "${1:-}" in
  --fetch-wheels) fetch_wheels ;;
  --environment) environment ;;
  "") session ;;
  *) echo "usage: bash bench/gpu_session.sh [--fetch-wheels]" >&2; exit 2 ;;
esac
