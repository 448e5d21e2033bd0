#!/usr/bin/env bash
# The GPU checks in one command: the GPU suite (pytest -m cuda), then benchmarks/gpu_step.py.
#
#   bash benchmarks/run_gpu_checks.sh                  # on a machine with a CUDA GPU
#   bash benchmarks/run_gpu_checks.sh --download .whl  # elsewhere: fetch the wheels it needs,
#                                                      # for a GPU machine that has no network
#
# It runs on the machine's own CUDA build of torch (PYTHON, default python3), which is never
# downloaded or replaced: only the packages that interpreter lacks are installed, into a folder
# of their own (SITE) put on PYTHONPATH -- from PyPI, or, where a wheel folder exists (WHEELS,
# default .whl), from that folder alone. (A venv with --system-site-packages would not do: on
# many GPU images python3 is itself a venv, whose packages such a venv does not see.) The
# package is used from this checkout (PYTHONPATH), not installed.
#
# Variables: PYTHON, SITE (default /tmp/notebook-accel-gpu-site), WHEELS, BUDGET (seconds for
# the whole run, default 540: the suite gets up to 330 of them, the benchmark what is left),
# TORCHAO (the torchao requirement, default "torchao"; pin the release that matches the
# machine's torch, or set it empty to skip fp8 on the GPU), DEEPSPEED (likewise, default
# "deepspeed": a source package, so --download builds its wheel here against this machine's
# torch, without its ops, which DeepSpeed compiles when first used). With OUT set, the log
# goes to $OUT/gpu_checks.log too. Exit status: the suite's (the benchmark only reports).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/notebook-accel-gpu-site}
WHEELS=${WHEELS:-.whl}
BUDGET=${BUDGET:-540}
TORCHAO=${TORCHAO-torchao}
DEEPSPEED=${DEEPSPEED-deepspeed}
NEEDS=(ipykernel ipywidgets nbclient nbformat cloudpickle tqdm psutil numpy pytest
  pytest-timeout nvidia-ml-py)

if [ "${1:-}" = "--download" ]; then
  # Wheels for the lent GPU machine (Python 3.12, x86-64 Linux), with their dependencies.
  dest=${2:-.whl}
  mkdir -p "$dest"
  for platform in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    args+=(--platform "$platform")
  done
  "$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.12 \
    --implementation cp "${args[@]}" -d "$dest" "${NEEDS[@]}" ${TORCHAO:+"$TORCHAO"} || exit 1
  [ -n "$DEEPSPEED" ] || exit 0
  "$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    "${args[@]}" -d "$dest" hjson pydantic || exit 1  # what the GPU image lacks of its needs
  exec "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$dest" "$DEEPSPEED"
fi

log() { echo "run_gpu_checks: $*"; }
if [ -n "${OUT:-}" ]; then exec > >(tee "$OUT/gpu_checks.log") 2>&1; fi
start=$(date +%s)

if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)'; then
  log "$PYTHON has no CUDA build of torch: nothing to check here (PYTHON=... to choose one)"
  [ -n "${ALLOW_CPU:-}" ] || exit 0  # ALLOW_CPU=1: go on anyway (everything skips; for testing)
fi
py=$PYTHON
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
torch_before=$("$py" -c 'import torch; print(torch.__version__, torch.__file__)')
pip=("$py" -m pip install -q --disable-pip-version-check --target "$SITE")
if [ -d "$WHEELS" ]; then
  pip+=(--no-index --find-links "$WHEELS")
  log "installing from $WHEELS only"
fi
missing=()
for name in "${NEEDS[@]}"; do
  module=${name//-/_}
  case $name in nvidia-ml-py) module=pynvml ;; pytest-timeout) module=pytest_timeout ;; esac
  "$py" -c "import $module" 2>/dev/null || missing+=("$name")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing into $SITE: ${missing[*]}"
  "${pip[@]}" "${missing[@]}" || { log "could not install ${missing[*]}"; exit 1; }
fi
if [ -n "$TORCHAO" ] && ! "$py" -c 'import torchao' 2>/dev/null; then
  "${pip[@]}" "$TORCHAO" || log "torchao not installed: the fp8 GPU tests will skip"
fi
if [ -n "$DEEPSPEED" ] && ! "$py" -c 'import deepspeed' 2>/dev/null; then
  # --target installs every dependency anew (torch too): DeepSpeed alone, then what GPU
  # images lack of its needs
  { "${pip[@]}" --no-deps "$DEEPSPEED" && "${pip[@]}" hjson pydantic; } ||
    log "deepspeed not installed: its GPU tests will skip"
fi
torch_after=$("$py" -c 'import torch; print(torch.__version__, torch.__file__)')
if [ "$torch_before" != "$torch_after" ]; then
  log "torch changed ($torch_before -> $torch_after): stopping"
  exit 1
fi

export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
"$py" - <<'EOF'
import torch, notebook_accel
from notebook_accel import hardware
m = hardware.detect()
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); GPUs: {m.cuda_names}; "
      f"compute capability {m.cuda_capability}; found by: {m.cuda_method}")
EOF

suite_budget=$((BUDGET < 330 ? BUDGET : 330))
log "GPU suite: pytest -m cuda (up to ${suite_budget}s)"
timeout --signal=INT --kill-after=20 "$suite_budget" \
  "$py" -m pytest -m cuda -p no:cacheprovider -q -rA tests/cuda tests/training/test_accelerator_training.py
suite=$?
[ $suite -eq 124 ] && log "the GPU suite ran past ${suite_budget}s"

left=$((BUDGET - ($(date +%s) - start)))
if [ $left -gt 60 ]; then
  log "benchmark: benchmarks/gpu_step.py (up to ${left}s)"
  timeout --signal=INT --kill-after=20 "$left" "$py" benchmarks/gpu_step.py ||
    log "the benchmark did not finish (status $?)"
else
  log "no time left for the benchmark (${left}s)"
fi
log "GPU suite exit status: $suite"
exit $suite
