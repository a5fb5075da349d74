#!/usr/bin/env bash
# laya's decode step on a GPU machine: its tests and its measurements, after
# `scripts/gpu/cuda-ops.sh build` here and with libmlx's parts staged there (`cuda-ops.sh stage
# aa`, `stage ab`); carry .device/mlx_ops.xz and .device/laya.xz.
#
#   scripts/gpu/decode-step.sh tests   # the step's and the RoPE primitive's tests and MLX's op
#                                      # tests (the decode path against whole forwards), on the GPU
#   scripts/gpu/decode-step.sh bench [SHAPE...]
#                                      # laya bench engine on synthetic q8 weights of each SHAPE
#                                      # (default: the 0.5B and the 1.5B): the step, the RoPE
#                                      # primitive and MLX's ops side by side in one process
#   scripts/gpu/decode-step.sh moe     # the 30B-A3B's prompt (q4, 512 and 2,048 tokens): the
#                                      # experts' rows in padded blocks, then sorted
# Rows go to $OUT (/tmp if unset) as JSON lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
x() { bash scripts/gpu/cuda-ops.sh exec "$@"; }

# The carried binaries, unpacked every call (a warm machine keeps the last call's; python3's
# lzma: the machine may have no xz).
for b in mlx_ops laya; do
  if [[ -f .device/$b.xz ]]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      ".device/$b.xz" ".device/$b" && chmod +x ".device/$b"
  fi
done

case "${1:-}" in
tests)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  rc=0
  # The step's tests alone and first, then the rest: a kernel fault ends its process, not the
  # others'. Each process has its own time limit (killed, not left running beside what comes
  # next), its output in a file as it comes.
  for set in "models::step::" "models::rope_kv:: mlx_ops::"; do
    log=$out/tests-${set%%:*}.log
    # shellcheck disable=SC2086
    x env LAYA_DEVICE=gpu timeout -s KILL "${TEST_LIMIT:-150}" .device/mlx_ops $set --test-threads=1 >"$log" 2>&1
    status=$?
    [[ $status -eq 0 ]] || { rc=1; echo "== $set: exit $status (137: killed at the limit)"; }
    grep -E "^test |test result|panicked|Δ| off |rel err|laya" "$log"
  done
  exit $rc
  ;;
bench)
  shift
  shapes=("$@")
  [[ ${#shapes[@]} -gt 0 ]] || shapes=(qwen2.5-coder-0.5b qwen2.5-coder-1.5b)
  for shape in "${shapes[@]}"; do
    echo "== $shape ($(date +%T))"
    x .device/laya --device gpu bench engine --synthetic "$shape" --precision q8 --prefill 128,2048 \
      --decode 64 --json "$out/step-$shape.jsonl" 2>&1 | grep -v '^\s*$' | tail -16
  done
  ;;
moe)
  for rows in blocks sorted; do
    echo "== 30B-A3B, experts' rows $rows ($(date +%T))"
    LAYA_MOE_ROWS=$rows x .device/laya --device gpu bench engine --synthetic qwen3-coder-30b-a3b \
      --precision q4 --prefill 512,2048 --decode 16 --json "$out/moe-$rows.jsonl" 2>&1 \
      | grep -v '^\s*$' | tail -6
  done
  ;;
*)
  awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"
  exit 2
  ;;
esac
