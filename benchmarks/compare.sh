#!/usr/bin/env bash
# Measures two commits alternately in one sitting (this shared machine's load moves figures by
# up to 20% within the hour): the fast model's pipeline CPU and throughput, then the slow
# model's saturation and 200 req/s latency.
#
#   benchmarks/compare.sh BASE_COMMIT [ROUNDS]   # from the repository root, venv in .venv
#
# BASE_COMMIT is checked out in a temporary git worktree; the other side is this working tree.
# The sides take turns going first, round by round, so that an effect of the order cancels out
# (benchmarks/README.md, the thirty-second session).
# Every figure is printed under the side and command that produced it.
set -euo pipefail

base=${1:?usage: benchmarks/compare.sh BASE_COMMIT [ROUNDS]}
rounds=${2:-2}
here=$(pwd)
python=$here/.venv/bin/python
tree=$(mktemp -d)
git worktree add --detach --quiet "$tree" "$base"
trap 'git worktree remove --force "$tree"' EXIT

measure() {  # side folder command...
  local side=$1 folder=$2
  shift 2
  echo "=== $side: $*"
  (cd "$folder" && PYTHONPATH=$folder "$python" "$@" 2>&1 | grep -E "^ +(32|256)[ :]|batched|^run |^A batch's cost")
}

fast=(--requests 20000 --base-ms 2 --per-item-ms 0.02)
order=(base this)
for _ in $(seq "$rounds"); do
  for side in "${order[@]}"; do
    folder=$here
    [[ $side == base ]] && folder=$tree
    measure $side "$folder" benchmarks/pipeline_cpu.py
    measure $side "$folder" -m workers.cli bench saturate "${fast[@]}"
    measure $side "$folder" -m workers.cli bench saturate "${fast[@]}" --inflight 256
  done
  order=("${order[1]}" "${order[0]}")
done
for side in "${order[@]}"; do
  folder=$here
  [[ $side == base ]] && folder=$tree
  measure $side "$folder" -m workers.cli bench saturate --requests 10000
  measure $side "$folder" -m workers.cli bench rate --rate 200 --duration 30
done
