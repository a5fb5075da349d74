#!/usr/bin/env bash
# On the GPU machine after `scripts/gpu/cuda-ops.sh unbundle`: the real-model numbers of
# docs/benchmarks.md for one GGUF (default: the 0.5B) at q8 on MLX CUDA. STEPS picks them:
#   complete   `laya complete examples/fib.py:5:1` (sanity: a real completion, time split);
#   quality    `laya bench quality` over all cases beside llama.cpp's answers (PEER), at laya's
#              default suffix share (by model size: 0.02 under 1B parameters, 0.06 above) and at
#              0.15;
#   typing     `laya bench typing` over the first case of each language (2048-token budget,
#              16 tokens): anchored prompts (the default), fresh prompts with a 0.15 suffix,
#              fresh prompts with a short suffix (all with the prefix store), and no reuse;
#   llama      build llama.cpp's llama-server with CUDA (sm_90) from .peer/llama.cpp.tar.xz into
#              /tmp/llama-cuda (once per machine; the source is llama-cpp-python 0.3.36's
#              vendored llama.cpp, packed here by scripts/gpu/peer-cuda-source.sh);
#   peer-typing  the typing traces of `typing` (anchored) and the long-file traces in LONG
#              (FILE:LINE:LANG ..., 2k-token prompts) through laya, then the same keystrokes
#              through that llama-server's /infill with cache_prompt, without and with
#              --cache-reuse 256, on the same GPU and GGUF;
#   peer-quality  the quality cases through that llama-server's /infill, then `laya bench
#              quality` compared with those answers (CASES: the case file, default
#              bench/quality/cases.jsonl; bench/quality/cases-large.jsonl for 100 a language).
#   server-quality  only the first half of peer-quality: llama-server's /infill answers to CASES
#              (N_CTX, default 4096, and BATCH, default 4096: for the whole-file case sets
#              N_CTX=8192 BATCH=2048, llama-server's default batch and laya's default budget);
#   laya-quality  only `laya bench quality` on CASES, once per prompt variant in VARIANTS
#              (default: "default"; `default` is laya's defaults; `nocontext`
#              brings back nothing the window cut off, contextShare 0; `list` writes what it
#              brings back as a list, not the file's outline; `suffix0.15`; NAME=JSON runs
#              with settings JSON, answers named after NAME, e.g. 'b4096={"budget":{"maxTokens":4096}}'); score the
#              answers against server-quality's with bench/quality/score.py.
#              The cross-file sets run each case in its workspace (bench/quality/repos):
#              CASES=bench/quality/cases-repo-xl.jsonl.xz N_CTX=8192 BATCH=2048
#              STEPS="server-quality laya-quality" VARIANTS='default noworkspace={"workspaceContext":false}'.
# Results (JSON) and a log go to $OUT (default /tmp).
set -uo pipefail
cd "$(dirname "$0")/../.."
G=${GGUF:-/tmp/laya-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
PEER=${PEER:-bench/quality/results/llama.cpp-0.5b.json}
TAG=${TAG:-0.5b}
out=${OUT:-/tmp}
log=$out/gpu-real-$TAG.log
STEPS=${STEPS:-complete quality typing}
LLAMA=/tmp/llama-cuda/build/bin/llama-server
CASES=${CASES:-bench/quality/cases.jsonl}   # or bench/quality/cases-large.jsonl
if [[ $CASES == *.xz ]]; then  # a compressed case file (cases-xl-file.jsonl.xz): unpack it once
  [[ -f /tmp/$(basename "$CASES" .xz) ]] || xz -dc "$CASES" >"/tmp/$(basename "$CASES" .xz)"
  CASES=/tmp/$(basename "$CASES" .xz)
fi
SET=$(basename "$CASES" .jsonl)
LONG=${LONG:-}
laya() { scripts/gpu/cuda-ops.sh exec .device/laya --device gpu "$@"; }
say() { echo "== $* ($(date +%T))" | tee -a "$log"; }
short='"budget":{"suffixShare":0.02}'
long_suffix='"budget":{"suffixShare":0.15}'
fresh='"anchorMaxBytes":0,"typingThrough":false'
for step in $STEPS; do
  case $step in
  complete)
    say "complete examples/fib.py:5:1"
    laya complete examples/fib.py:5:1 --model "$G" 2>&1 | tee -a "$log" ;;
  quality)
    say "bench quality (the default suffix share)"
    laya bench quality --model "$G" --precision q8 --compare "$PEER" --out "$out/q-$TAG.json" 2>>"$log.err" | tee -a "$log"
    say "bench quality (suffix share 0.15)"
    laya bench quality --model "$G" --precision q8 --compare "$PEER" --settings "{$long_suffix}" \
      --out "$out/q-$TAG-suffix0.15.json" 2>>"$log.err" | tee -a "$log" ;;
  llama)
    if [[ ! -x $LLAMA && -f .peer/llama-server-cuda-sm90.xz ]]; then  # one built earlier, carried
      mkdir -p "$(dirname "$LLAMA")" && xz -dc .peer/llama-server-cuda-sm90.xz >"$LLAMA" && chmod +x "$LLAMA"
    fi
    # A binary that cannot complete one token on this machine (built for another GPU or CUDA,
    # or crashing) is built again from source.
    if [[ -x $LLAMA ]] && ! python3 scripts/llama_server.py --check "$LLAMA" "$G" 2>&1 | tee -a "$log"; then
      say "llama-server fails its one-token check: building it again"
      rm -f "$LLAMA"
    fi
    if [[ ! -x $LLAMA ]]; then
      say "build llama-server (CUDA)"
      command -v nvcc >/dev/null || export PATH="$PATH:$(ls -d /usr/local/cuda*/bin 2>/dev/null | head -1)"
      command -v nvcc | tee -a "$log"
      mkdir -p /tmp/llama-cuda && tar -C /tmp/llama-cuda --strip-components=1 -xJf .peer/llama.cpp.tar.xz
      cmake -S /tmp/llama-cuda -B /tmp/llama-cuda/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >>"$log" 2>&1
      timeout "${LLAMA_BUILD_TIMEOUT:-540}" ninja -C /tmp/llama-cuda/build llama-server >>"$log" 2>&1
      tail -3 "$log"
      python3 scripts/llama_server.py --check "$LLAMA" "$G" 2>&1 | tee -a "$log"
      [[ ${PIPESTATUS[0]} == 0 ]] || { say "the llama-server just built fails a one-token completion of $G (above)"; exit 1; }
    fi
    "$LLAMA" --version 2>&1 | tail -2 | tee -a "$log"
    # Keep the binary for later runs (carry it back instead of building again).
    # (in 15 MiB pieces, which a transport with a per-file limit brings back; join them with cat
    # into .peer/llama-server-cuda-sm90.xz).
    strip -o /tmp/llama-server.stripped "$LLAMA" && xz -T0 -6 -c /tmp/llama-server.stripped >"$out/llama-server-cuda-sm90.xz" \
      && split -b 15m -d "$out/llama-server-cuda-sm90.xz" "$out/llama-server-cuda-sm90.xz.part." ;;
  peer-typing)
    traces=()
    for f in $LONG; do traces+=(--file "$f"); done
    for set in ${SETS:-cases long}; do
      if [[ $set == cases ]]; then sel=(); else [[ ${#traces[@]} -gt 0 ]] || continue; sel=("${traces[@]}"); fi
      say "bench typing, laya ($set)"
      laya bench typing --sequential --model "$G" --precision q8 --budget 2048 --max-tokens 16 "${sel[@]}" \
        --steps-out "$out/steps-$TAG-$set.json" --json "$out/t-$TAG-$set.json" 2>>"$log.err" | tee -a "$log"
      [[ -x $LLAMA ]] || { say "no $LLAMA (run STEPS=llama first): laya only"; continue; }
      for reuse in 0 256; do
        extra=(); [[ $reuse == 0 ]] || extra=(--server-arg=--cache-reuse "--server-arg=$reuse")
        say "bench typing, llama-server /infill ($set, cache-reuse $reuse)"
        python3 scripts/bench_typing_peer.py --server-bin "$LLAMA" --model "$G" --steps "$out/steps-$TAG-$set.json" \
          --max-tokens 16 --budget 2048 "${extra[@]}" --server-log "$out/llama-server-$set-$reuse.log" \
          --out "$out/t-llama-$TAG-$set-reuse$reuse.json" 2>>"$log.err" | tee -a "$log"
      done
    done ;;
  peer-quality)
    say "llama-server /infill on the quality cases"
    python3 scripts/bench_infill.py --server-bin "$LLAMA" --model "$G" --cases "$CASES" \
      --server-log "$out/llama-server-quality.log" --out "$out/llama-server-$TAG-$SET.json" 2>>"$log.err"
    say "bench quality against it"
    laya bench quality --model "$G" --precision q8 --cases "$CASES" --compare "$out/llama-server-$TAG-$SET.json" \
      --out "$out/q-$TAG-$SET-vs-server.json" 2>>"$log.err" | tee -a "$log" ;;
  server-quality)
    say "llama-server /infill on $CASES"
    python3 scripts/bench_infill.py --server-bin "$LLAMA" --model "$G" --cases "$CASES" \
      --n-ctx "${N_CTX:-4096}" --batch-size "${BATCH:-4096}" \
      --server-log "$out/llama-server-$TAG-$SET.log" --out "$out/llama-server-$TAG-$SET.json" 2>>"$log.err" ;;
  laya-quality)
    for variant in ${VARIANTS:-default}; do
      case $variant in
      default) extra=() ;;
      nocontext) extra=(--settings '{"budget":{"contextShare":0}}') ;;
      list) extra=(--settings '{"contextLayout":"list"}') ;;
      suffix0.15) extra=(--settings "{$long_suffix}") ;;
      *=*) extra=(--settings "${variant#*=}"); variant=${variant%%=*} ;;
      *) say "unknown variant $variant"; continue ;;
      esac
      say "bench quality on $CASES ($variant)"
      laya bench quality --model "$G" --precision q8 --cases "$CASES" --repos bench/quality/repos "${extra[@]}" \
        --out "$out/q-$TAG-$SET-$variant.json" 2>>"$log.err" | tee -a "$log"
    done ;;
  typing)
    for run in anchored fresh fresh-short no-reuse; do
      case $run in
      anchored) extra=() ;;
      fresh) extra=(--settings "{$fresh,$long_suffix}") ;;
      fresh-short) extra=(--settings "{$fresh,$short}") ;;
      no-reuse) extra=(--no-reuse) ;;
      esac
      say "bench typing ($run)"
      laya bench typing --sequential --model "$G" --precision q8 --budget 2048 --max-tokens 16 "${extra[@]}" \
        --json "$out/t-$TAG-$run.json" 2>>"$log.err" | tee -a "$log"
    done ;;
  esac
done
say done
tail -5 "$log.err"
