#!/usr/bin/env bash
# On the GPU machine after `scripts/cuda-ops.sh unbundle`: the real-model numbers of
# docs/benchmarks.md for one GGUF (default: the 0.5B) at q8 on MLX CUDA:
#   - `laya complete examples/fib.py:5:1` (sanity: a real completion, time split);
#   - `laya bench quality` over all cases beside llama.cpp's answers, at the default suffix
#     share (0.15 of the budget) and a short one (0.02), the two FIM-suffix strategies;
#   - `laya bench typing` over the first case of each language (2048-token budget, 16 tokens):
#     anchored prompts (the default), fresh prompts with the full suffix, fresh prompts with a
#     short suffix (all with the prefix store), and no reuse at all.
# Results (JSON) and a log go to $OUT (default /tmp). STEPS limits the runs (e.g. "complete quality").
set -uo pipefail
cd "$(dirname "$0")/.."
G=${GGUF:-/tmp/laya-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
PEER=${PEER:-bench/quality/results/llama.cpp-0.5b.json}
TAG=${TAG:-0.5b}
out=${OUT:-/tmp}
log=$out/gpu-real-$TAG.log
STEPS=${STEPS:-complete quality typing}
laya() { scripts/cuda-ops.sh exec .device/laya --device gpu "$@"; }
say() { echo "== $* ($(date +%T))" | tee -a "$log"; }
short='"budget":{"suffixShare":0.02}'
fresh='"anchorMaxBytes":0,"typingThrough":false'
for step in $STEPS; do
  case $step in
  complete)
    say "complete examples/fib.py:5:1"
    laya complete examples/fib.py:5:1 --model "$G" 2>&1 | tee -a "$log" ;;
  quality)
    say "bench quality (suffix share 0.15)"
    laya bench quality --model "$G" --precision q8 --compare "$PEER" --out "$out/q-$TAG.json" 2>>"$log.err" | tee -a "$log"
    say "bench quality (suffix share 0.02)"
    laya bench quality --model "$G" --precision q8 --compare "$PEER" --settings "{$short}" \
      --out "$out/q-$TAG-short.json" 2>>"$log.err" | tee -a "$log" ;;
  typing)
    for run in anchored fresh fresh-short no-reuse; do
      case $run in
      anchored) extra=() ;;
      fresh) extra=(--settings "{$fresh}") ;;
      fresh-short) extra=(--settings "{$fresh,$short}") ;;
      no-reuse) extra=(--no-reuse) ;;
      esac
      say "bench typing ($run)"
      laya bench typing --model "$G" --precision q8 --budget 2048 --max-tokens 16 "${extra[@]}" \
        --json "$out/t-$TAG-$run.json" 2>>"$log.err" | tee -a "$log"
    done ;;
  esac
done
say done
tail -5 "$log.err"
