#!/usr/bin/env bash
# On the GPU machine after `scripts/gpu/cuda-ops.sh unbundle`: runs a few masked-line cases of
# bench/quality on the real GGUF at each precision and with MLX's CUDA switches, to find which
# configuration gives sane completions. Prints one table per configuration; with FULL=1 also
# runs all cases for the configurations that reach a non-zero exact-line rate.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LAYA_CACHE_DIR=${LAYA_CACHE_DIR:-/tmp/lc}
G=${GGUF:-/tmp/laya-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
out=${OUT:-/tmp}
run() { # label env... -- args...
  local label=$1; shift
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  echo "== $label"
  env "${envs[@]}" timeout 150 scripts/gpu/cuda-ops.sh exec .device/laya --device gpu bench quality --model "$G" \
    --limit "${LIMIT:-2}" --compare bench/quality/results/llama.cpp-0.5b.json --out "$out/probe-$label.json" "$@" \
    2>"$out/probe-$label.err" | grep -E "^\| all|^\| python" || tail -2 "$out/probe-$label.err"
}
run q8-nographs MLX_USE_CUDA_GRAPHS=0 -- --precision q8
run q4 X=1 -- --precision q4
run q6 X=1 -- --precision q6
run native-nocudnn MLX_CUDA_USE_CUDNN_SDPA=0 -- --precision native
run native-nographs MLX_USE_CUDA_GRAPHS=0 -- --precision native
