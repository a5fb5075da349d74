#!/usr/bin/env bash
# One GPU session as a queue of measurements that runs in the background on the GPU machine
# while the model files are still being carried to it, one part a call (a call carries at
# most 64 MiB with the working tree; the 0.5B and 1.5B GGUFs are 1.6 GB).
#
# Here, before the session:
#   scripts/gpu/cuda-ops.sh build laya         # libmlx's parts and the laya binary in .device/
#   scripts/gpu/session.sh pack                 # .stage/: laya.xz, the GGUFs in parts, MANIFEST,
#                                               # the case subsets; prints the part names
# On the GPU machine, one call each, in order (each names its parts in `carry`):
#   scripts/gpu/session.sh stage FILE...        # keep carried .stage/FILEs (and .device/mlx parts)
#   scripts/gpu/session.sh start [QUEUE]        # the queue, in its own process session (recheck:
#                                               # only the held-out file windows beside llama-server,
#                                               # 0.5B and 1.5B, then the MoE shape beside mlx-lm;
#                                               # decode: the MLX op tests, then .device/laya-base
#                                               # (a build to compare with) and laya alternated on
#                                               # synthetic shapes, the 0.5B's explicit and automatic
#                                               # requests on the held-out file windows beside
#                                               # llama-server, the 32B's cancel and prefill, mlx-lm;
#                                               # decode-short: its synthetic shapes only, no GGUF;
#                                               # ghost: explicit requests and a typist through
#                                               # `laya lsp` beside llama-server, the 0.5B)
#                                               # For decode: PACK_MODELS=<the 0.5B's GGUF> at pack,
#                                               # `decide bf16 0` before start.
#   scripts/gpu/session.sh decide ACT [CUDNN]   # the activation type the later jobs run with, and
#                                               # MLX's cuDNN attention (1) or not (0, the default)
#   scripts/gpu/session.sh status               # the log's end and the results so far
#   scripts/gpu/session.sh wait [SECONDS]       # status once the queue is done or SECONDS passed
#                                               # (the machine goes back after 30 s without a call)
#   scripts/gpu/session.sh collect              # results and logs into $OUT/session.tgz
#
# The queue (`run`), each job waiting for the files it needs: `diag` (the synthetic 0.5B with
# f32, bf16 and f16 activations, MLX's cuDNN attention on and off; skipped when `decide` came
# before `start`), then, once `decide` has named the activation type: `probe` (MLX's CUDA graph
# settings on the tuning set's file windows, the 0.5B; the winner is kept for the rest),
# `real 0.5b` (engine bench, held-out file windows and cross-file beside llama-server), `stall`
# (the first request of each new prompt size after `laya serve` is ready), `real 1.5b`,
# `synthetic` (3B / 32B / 30B-A3B beside mlx-lm).
# Results go to /tmp/laya-session/results.
set -uo pipefail
cd "$(dirname "$0")/../.."
S=/tmp/laya-session
R=$S/results
M=$S/models
mkdir -p "$S/parts" "$R" "$M"

log() { echo "== $* ($(date +%T))"; }

wait_for() { # wait_for FILE...: until every FILE exists
  for f in "$@"; do
    until [[ -e $f ]]; do sleep 2; done
  done
}

# Joins the parts of model $1 once all of them are here, checking size and sha256.
assemble() {
  local name=$1 out=$M/$1
  [[ -f $out ]] && return 0
  local count sha
  read -r count sha < <(awk -v n="$name" '$1 == n { print $2, $3 }' "$S/MANIFEST")
  until [[ $(ls "$S/parts/$name".* 2>/dev/null | wc -l) -ge $count ]]; do sleep 2; done
  cat "$S/parts/$name".* >"$out.tmp"
  if [[ $(sha256sum "$out.tmp" | cut -d' ' -f1) != "$sha" ]]; then
    log "$name: sha256 mismatch"
    return 1
  fi
  mv "$out.tmp" "$out" && rm -f "$S/parts/$name".*
  log "$name assembled"
}

case "${1:-}" in
pack)
  mkdir -p .stage
  rm -f .stage/*
  xz -T2 -6 -c .device/laya >.stage/laya.xz
  # A build to compare with (`.device/laya-base`, e.g. the commit before a change) and the MLX
  # op tests (`.device/mlx_ops`), where present.
  for b in laya-base mlx_ops; do
    [[ -f .device/$b ]] && xz -T2 -6 -c ".device/$b" >".stage/$b.xz"
  done
  : >.stage/MANIFEST
  part_mb=${PART_MB:-46}
  for g in ${PACK_MODELS:-qwen2.5-coder-0.5b-instruct-q4_k_m.gguf qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}; do
    src=${LAYA_MODEL_DIR:-$HOME/.cache/laya/models}/$g
    split -b "${part_mb}m" -d -a 2 "$src" ".stage/$g."
    echo "$g $(ls .stage/"$g".* | wc -l) $(sha256sum "$src" | cut -d' ' -f1)" >>.stage/MANIFEST
  done
  # Held-out file windows: every other case (50 a language); the tuning set's: every fourth.
  xz -dc bench/quality/cases-xl-file.jsonl.xz | awk 'NR % 2 == 1' >.stage/xl-file-300.jsonl
  xz -dc bench/quality/cases-large-file.jsonl.xz | awk 'NR % 4 == 1' >.stage/large-file-150.jsonl
  xz -dc bench/quality/cases-repo-xl.jsonl.xz >.stage/repo-xl.jsonl
  cat .stage/MANIFEST
  ls -la .stage
  ;;
stage)
  shift
  for f in "$@"; do
    case $f in
    mlx.tar.xz.*) mkdir -p /tmp/laya-cuda && cp ".device/$f" /tmp/laya-cuda/ ;;
    *.gguf.*) cp ".stage/$f" "$S/parts/" ;;
    *) cp ".stage/$f" "$S/" ;;
    esac
  done
  for b in laya laya-base mlx_ops; do
    if [[ -f $S/$b.xz && ! -x $S/$b ]]; then xz -dc "$S/$b.xz" >"$S/$b.tmp" && chmod +x "$S/$b.tmp" && mv "$S/$b.tmp" "$S/$b"; fi
  done
  if [[ -f .peer/llama-server-cuda-sm90.xz && ! -x $S/llama-server ]]; then
    xz -dc .peer/llama-server-cuda-sm90.xz >"$S/llama-server" && chmod +x "$S/llama-server"
  fi
  echo "staged: $(ls "$S/parts" | wc -l) parts, $(ls "$M" | wc -l) models; $(du -sh "$S" | cut -f1)"
  ;;
start)
  # The queue runs from a copy of the scripts and case files: later calls replace the checkout.
  rm -rf "$S/repo" && mkdir -p "$S/repo"
  cp -r scripts examples "$S/repo/" && mkdir -p "$S/repo/bench/quality" && cp -r bench/quality/repos "$S/repo/bench/quality/"
  [[ -d .whl ]] && cp -r .whl "$S/repo/"
  echo "${2:-full}" >"$S/queue"
  setsid nohup bash "$S/repo/scripts/gpu/session.sh" run >"$S/runner.log" 2>&1 </dev/null &
  echo "queue started (pid $!)"
  ;;
decide)
  echo "$2 ${3:-0}" >"$S/act"
  echo "activations: $2, cuDNN attention: ${3:-0}"
  ;;
status)
  tail -n "${2:-30}" "$S/runner.log"
  [[ -n ${OUT:-} ]] && tar -C "$S" -czf "$OUT/session.tgz" results runner.log
  ls -la "$R"
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  ;;
wait)
  # Keeps the machine busy (it goes back after 30 s idle) until the queue is done or $2
  # seconds passed, then reports as `status` does.
  end=$((SECONDS + ${2:-240}))
  while ((SECONDS < end)) && ! grep -q "all done" "$S/runner.log" 2>/dev/null; do sleep 5; done
  bash "$0" status "${3:-30}"
  ;;
collect)
  tar -C "$S" -czf "${OUT:-/tmp}/session.tgz" results runner.log
  ls -la "${OUT:-/tmp}/session.tgz"
  ;;
run)
  # Here: $S/repo (scripts, examples, bench/quality/repos, .whl).
  L=$S/laya
  wait_for "$L" /tmp/laya-cuda/mlx.tar.xz.aa /tmp/laya-cuda/mlx.tar.xz.ab
  cx() { scripts/gpu/cuda-ops.sh exec "$@"; }
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  G05=$M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  G15=$M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  XL=$S/xl-file-300.jsonl TUNE=$S/large-file-150.jsonl REPO=$S/repo-xl.jsonl

  # A session that has decided already (`decide` before `start`) skips the comparison.
  [[ -f $S/act ]] && DIAG=() || DIAG=(f32:1 bf16:1 bf16:0 f16:0)
  for v in "${DIAG[@]}"; do
    act=${v%:*} cudnn=${v#*:}
    log "diag $act cudnn=$cudnn"
    LAYA_ACTIVATIONS=$act MLX_CUDA_USE_CUDNN_SDPA=$cudnn cx "$L" --device gpu bench engine \
      --synthetic qwen2.5-coder-0.5b --precision q8 --prefill 128,700,1352,2048 --decode 32 \
      --json "$R/diag-$act-cudnn$cudnn.jsonl" 2>&1 | grep -v "^\s*$" | tail -25
  done
  [[ ${#DIAG[@]} -eq 0 ]] || log "diag done; waiting for decide"
  wait_for "$S/act"
  read -r ACT CUDNN <"$S/act"
  export LAYA_ACTIVATIONS=$ACT MLX_CUDA_USE_CUDNN_SDPA=${CUDNN:-0}
  log "activations $ACT, cuDNN attention $MLX_CUDA_USE_CUDNN_SDPA"

  real() { # real TAG GGUF [short]: short leaves out the f32 rows and the tuning set
    local tag=$1 g=$2 short=${3:-}
    log "$tag: engine bench ($ACT)"
    cx "$L" --device gpu bench engine --model "$g" --precision q8 --prefill 128,512,2048 --decode 64 \
      --json "$R/engine-$tag-$ACT.jsonl" 2>&1 | tail -30
    log "$tag: llama-server /infill, held-out file windows (to the line break)"
    python3 scripts/bench_infill.py --server-bin "$S/llama-server" --model "$g" --cases "$XL" \
      --n-ctx 8192 --batch-size 2048 --stop '\n' --server-log "$R/llama-server-$tag-line.log" \
      --out "$R/llama-server-$tag-xl-line.json" 2>&1 | tail -2
    log "$tag: llama-server /infill, cross-file held-out (plain FIM)"
    python3 scripts/bench_infill.py --server-bin "$S/llama-server" --model "$g" --cases "$REPO" \
      --n-ctx 8192 --batch-size 2048 --stop '\n' --out "$R/llama-server-$tag-repo-line.json" 2>&1 | tail -2
    runs=("$ACT-spec-off:$ACT:off")
    [[ -n $short ]] || runs+=("f32-spec-off:f32:off")
    for v in "${runs[@]}"; do
      IFS=: read -r name a spec <<<"$v"
      log "$tag: laya held-out file windows ($name)"
      LAYA_ACTIVATIONS=$a cx "$L" --device gpu bench quality --model "$g" --precision q8 --cases "$XL" \
        --speculation "$spec" --compare "$R/llama-server-$tag-xl-line.json" \
        --out "$R/laya-$tag-xl-$name.json" 2>>"$R/laya-$tag.err" | tail -14
    done
    [[ -n $short ]] && runs=()
    for v in "${runs[@]}"; do
      IFS=: read -r name a spec <<<"$v"
      log "$tag: laya tuning file windows ($name)"
      LAYA_ACTIVATIONS=$a cx "$L" --device gpu bench quality --model "$g" --precision q8 --cases "$TUNE" \
        --speculation "$spec" --out "$R/laya-$tag-tune-$name.json" 2>>"$R/laya-$tag.err" | tail -4
    done
    for ws in on off; do
      settings='{"workspaceContext":true}'; [[ $ws == off ]] && settings='{}'
      log "$tag: laya cross-file held-out (workspace $ws)"
      cx "$L" --device gpu bench quality --model "$g" --precision q8 --cases "$REPO" --repos bench/quality/repos \
        --settings "$settings" --compare "$R/llama-server-$tag-repo-line.json" \
        --out "$R/laya-$tag-repo-ws-$ws.json" 2>>"$R/laya-$tag.err" | tail -14
    done
    log "$tag: laya held-out file windows (drafts on)"
    cx "$L" --device gpu bench quality --model "$g" --precision q8 --cases "$XL" --speculation on \
      --compare "$R/llama-server-$tag-xl-line.json" --out "$R/laya-$tag-xl-$ACT-spec-on.json" \
      2>>"$R/laya-$tag.err" | tail -14
  }

  # MLX's CUDA graphs, chosen on the tuning set's file windows (the held-out runs use the
  # winner): as built (H100: graphs of up to 100 ops), no graphs (each kernel launched as it
  # comes), one graph a decode step.
  probe() { # probe GGUF
    local best='' best_p50=1e9 v name
    for v in "default:" "nographs:MLX_USE_CUDA_GRAPHS=0" "onegraph:MLX_MAX_OPS_PER_BUFFER=2000 MLX_MAX_MB_PER_BUFFER=100000"; do
      name=${v%%:*}
      log "probe $name (${v#*:}): laya tuning file windows, 0.5b"
      env ${v#*:} scripts/gpu/cuda-ops.sh exec "$L" --device gpu bench quality --model "$1" --precision q8 \
        --cases "$TUNE" --speculation off --out "$R/probe-$name.json" 2>>"$R/probe.err" | tail -3
      p50=$(python3 -c 'import json,statistics,sys; r=json.load(open(sys.argv[1]))["results"]; print(statistics.median(c["ms"] for c in r))' "$R/probe-$name.json")
      log "probe $name: p50 $p50 ms"
      if python3 -c "import sys; sys.exit(0 if $p50 < $best_p50 * 0.97 else 1)"; then best=${v#*:} best_p50=$p50; fi
    done
    echo "$best" >"$S/knobs"
    log "probe: chose '${best:-as built}'"
  }

  synthetic() {
    log "synthetic shapes beside mlx-lm"
    site=/tmp/mlx-site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      .whl/mlx-*.whl .whl/mlx_lm-*.whl 2>&1 | tail -2
    for d in lib include; do rm -rf "${site:?}/mlx/$d" && ln -s "/tmp/laya-cuda/mlx/$d" "$site/mlx/$d"; done
    for shape in ${SHAPES:-qwen2.5-coder-3b qwen2.5-coder-32b qwen3-coder-30b-a3b}; do
      log "laya --synthetic $shape"
      cx "$L" --device gpu bench engine --synthetic "$shape" --precision q4,q8 --prefill 128,2048 --decode 32 \
        --json "$R/synthetic-$shape.jsonl" 2>&1 | tail -8
      log "mlx-lm $shape"
      PYTHONPATH="$site" cx python3 scripts/gpu/bench_mlx_lm_moe.py --shape "$shape" --bits 4,8 --prefill 128,2048 \
        --decode 32 --ops --json "$R/mlx-lm-$shape.jsonl" 2>&1 | tail -3
    done
  }

  # llama-server's answers to the held-out file windows, ending at the line break.
  peer_line() { # peer_line TAG GGUF
    wait_for "$S/llama-server"
    log "$1: llama-server /infill, held-out file windows (to the line break)"
    python3 scripts/bench_infill.py --server-bin "$S/llama-server" --model "$2" --cases "$XL" \
      --n-ctx 8192 --batch-size 2048 --stop '\n' --server-log "$R/llama-server-$1-line.log" \
      --out "$R/llama-server-$1-xl-line.json" 2>&1 | tail -2
  }

  # A recheck: laya beside llama-server on the held-out file windows only, then the MoE shape.
  recheck() { # recheck TAG GGUF
    local tag=$1 g=$2
    peer_line "$tag" "$g"
    log "$tag: laya held-out file windows ($ACT-spec-off)"
    cx "$L" --device gpu bench quality --model "$g" --precision q8 --cases "$XL" --speculation off \
      --compare "$R/llama-server-$tag-xl-line.json" --out "$R/laya-$tag-xl-$ACT-spec-off.json" \
      2>>"$R/laya-$tag.err" | tail -14
  }
  # The decode step and where answers end: the MLX op tests on the GPU, then `laya-base` (the
  # build before) and `laya` alternated on the same shapes and cases.
  decode_queue() {
    local b shape
    wait_for "$S/mlx_ops"
    log "MLX op tests on the GPU"
    LAYA_DEVICE=gpu cx "$S/mlx_ops" mlx_ops:: --test-threads=1 2>&1 | grep -E "test |rel err|result" | tail -40
    wait_for "$S/laya-base"
    syn() { # syn SHAPE: this build and the one before
      for b in laya laya-base; do
        log "$b --synthetic $1"
        cx "$S/$b" --device gpu bench engine --synthetic "$1" --precision q8 --prefill 128,512,2048 --decode 64 \
          --json "$R/syn-$b-$1.jsonl" 2>&1 | grep -v "^\s*$" | tail -12
      done
    }
    big() { # the 32B, q4: cancel → free and prefill, both builds
      for b in laya laya-base; do
        log "$b --synthetic qwen2.5-coder-32b (cancel → free, prefill)"
        cx "$S/$b" --device gpu bench engine --synthetic qwen2.5-coder-32b --precision q4 --prefill 512,2048 \
          --decode 16 --json "$R/syn-$b-32b.jsonl" 2>&1 | grep -v "^\s*$" | tail -12
      done
    }
    moe() { # the 30B-A3B, q4: this build, mlx-lm, the build before
      log "laya --synthetic qwen3-coder-30b-a3b"
      cx "$S/laya" --device gpu bench engine --synthetic qwen3-coder-30b-a3b --precision q4 --prefill 512,2048 \
        --decode 32 --json "$R/syn-laya-30b-a3b.jsonl" 2>&1 | grep -v "^\s*$" | tail -12
      mlx_lm_site
      log "mlx-lm qwen3-coder-30b-a3b"
      PYTHONPATH=/tmp/mlx-site cx python3 scripts/gpu/bench_mlx_lm_moe.py --shape qwen3-coder-30b-a3b --bits 4 \
        --prefill 512,2048 --decode 32 --ops --json "$R/mlx-lm-30b-a3b.jsonl" 2>&1 | tail -3
      log "laya-base --synthetic qwen3-coder-30b-a3b"
      cx "$S/laya-base" --device gpu bench engine --synthetic qwen3-coder-30b-a3b --precision q4 --prefill 512,2048 \
        --decode 32 --json "$R/syn-laya-base-30b-a3b.jsonl" 2>&1 | grep -v "^\s*$" | tail -12
    }
    ready() { # setup's step (`laya models warm`, fresh kernel and converted caches), then
      # laya serve's time to ready and its first requests, the 0.5B
      local k=/tmp/laya-kernels-setup c=/tmp/laya-cache-setup
      rm -rf "$k" "$c"
      log "setup's step: laya models warm (empty kernel and converted caches)"
      MLX_PTX_CACHE_DIR=$k LAYA_CACHE_DIR=$c cx "$S/laya" --device gpu models warm --small "$G05" --large none 2>&1 | tail -5
      log "laya serve after setup: time to ready, first requests"
      MLX_PTX_CACHE_DIR=$k LAYA_CACHE_DIR=$c python3 scripts/gpu/first_request.py --laya "$S/laya" --model "$G05" \
        --cases "$XL" --sizes 150,700,1500 --wrap scripts/gpu/cuda-ops.sh --out "$R/ready-after-setup.json" 2>&1 | tail -5
    }
    # Most wanted first: the device time may end the queue anywhere.
    syn qwen2.5-coder-0.5b
    if [[ $(cat "$S/queue") == decode-short ]]; then
      # No model files: the synthetic shapes only.
      big
      moe
      syn qwen2.5-coder-3b
      return
    fi
    big
    assemble qwen2.5-coder-0.5b-instruct-q4_k_m.gguf || return
    log "laya held-out file windows, invoked (blocks, 128 tokens)"
    cx "$S/laya" --device gpu bench quality --model "$G05" --precision q8 --cases "$XL" --max-tokens 128 \
      --invoked --out "$R/laya-0.5b-xl-invoked.json" 2>>"$R/laya.err" | tail -8
    peer_line 0.5b "$G05"
    log "laya held-out file windows, automatic"
    cx "$S/laya" --device gpu bench quality --model "$G05" --precision q8 --cases "$XL" \
      --compare "$R/llama-server-0.5b-xl-line.json" --out "$R/laya-0.5b-xl-auto.json" 2>>"$R/laya.err" | tail -8
    moe
    ready
    syn qwen2.5-coder-3b
    log "laya-base held-out file windows, automatic"
    cx "$S/laya-base" --device gpu bench quality --model "$G05" --precision q8 --cases "$XL" \
      --compare "$R/llama-server-0.5b-xl-line.json" --out "$R/laya-base-0.5b-xl-auto.json" 2>>"$R/laya-base.err" | tail -8
  }
  # mlx's Python bindings and mlx-lm (.whl, carried) over the carried libmlx, in /tmp/mlx-site.
  mlx_lm_site() {
    local site=/tmp/mlx-site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      .whl/mlx-*.whl .whl/mlx_lm-*.whl 2>&1 | tail -2
    for d in lib include; do rm -rf "${site:?}/mlx/$d" && ln -s "/tmp/laya-cuda/mlx/$d" "$site/mlx/$d"; done
  }
  # Ghost text as a user waits for it (the 0.5B through `laya lsp` and the daemon, beside
  # llama-server on the same GGUF): explicit requests on the held-out file windows, then a
  # typist on 4 of them a language with the adaptive debounce and with a fixed 75 ms, then
  # llama-server's /infill under the typist's schedule, then the exact lines (in-process).
  ghost_queue() {
    export LAYA_RUNTIME_DIR=/tmp/laya-rt LAYA_CACHE_DIR=/tmp/laya-cache
    mkdir -p -m 700 "$LAYA_RUNTIME_DIR"
    # MLX compiles its kernels at first use (minutes on a new machine): the 0.5B's shape on
    # synthetic weights compiles them while the GGUF's parts are still coming.
    log "kernels: the 0.5B's shape on synthetic weights"
    cx "$L" --device gpu bench engine --synthetic qwen2.5-coder-0.5b --precision q8 --prefill 128,512,1500,2048 \
      --decode 32 2>&1 | grep -v "^\s*$" | tail -6
    assemble qwen2.5-coder-0.5b-instruct-q4_k_m.gguf || return
    wait_for "$S/llama-server"
    log "laya models warm (kernels for the 0.5B)"
    cx "$L" --device gpu models warm --small "$G05" --large none --precision q8 2>&1 | tail -3
    local lsp="$L --device gpu lsp --small $G05 --large none --precision q8"
    # Every request on the one model llama-server runs too (the 0.5B at q8; by default an
    # explicit request would ask the large tier at q6, prose the small at q4).
    local k='{"tier":"small","precision":"q8"}'
    local q8="{\"router\":{\"codeAutomatic\":$k,\"codeInvoked\":$k,\"codeBlock\":$k,\"prose\":$k}}"
    local q8_75="{\"debounceMs\":75,${q8:1}"
    log "explicit requests through laya lsp, held-out file windows"
    cx "$L" bench typing --explicit --cases "$XL" --per-language 50 --max-tokens 128 --lsp-command "$lsp" \
      --settings "$q8" --json "$R/explicit-laya.json" 2>>"$R/laya.err" | tail -3
    log "explicit requests, llama-server /infill (128 tokens, blank line ends)"
    python3 scripts/bench_infill.py --server-bin "$S/llama-server" --model "$G05" --cases "$XL" \
      --n-ctx 8192 --batch-size 2048 --max-tokens 128 --stop '\n\n\n' --out "$R/explicit-llama-server.json" 2>&1 | tail -2
    log "typist through laya lsp, adaptive debounce"
    cx "$L" bench typing --cases "$XL" --per-language "${TYPIST_PER_LANGUAGE:-4}" --max-tokens 48 --lsp-command "$lsp" \
      --settings "$q8" --steps-out "$R/typist-steps.json" --json "$R/typist-adaptive.json" 2>>"$R/laya.err" | tail -6
    log "typist through laya lsp, fixed 75 ms"
    cx "$L" bench typing --cases "$XL" --per-language "${TYPIST_PER_LANGUAGE:-4}" --max-tokens 48 --lsp-command "$lsp" \
      --settings "$q8_75" --json "$R/typist-fixed75.json" 2>>"$R/laya.err" | tail -6
    log "llama-server /infill under the typist's schedule"
    python3 scripts/bench_typing_peer.py --server-bin "$S/llama-server" --model "$G05" --steps "$R/typist-steps.json" \
      --schedule --max-tokens 48 --stop '\n' --budget 2048 --out "$R/typist-llama-server.json" 2>>"$R/peer.err" | tail -2
    log "exact lines, held-out file windows (in-process)"
    cx "$L" --device gpu bench quality --model "$G05" --precision q8 --cases "$XL" --speculation off \
      --out "$R/quality-0.5b-xl.json" 2>>"$R/laya.err" | tail -6
  }
  if [[ $(cat "$S/queue" 2>/dev/null) == ghost ]]; then
    ghost_queue
    log "all done"
    exit 0
  fi
  if [[ $(cat "$S/queue" 2>/dev/null) == decode* ]]; then
    decode_queue
    log "all done"
    exit 0
  fi

  if [[ $(cat "$S/queue" 2>/dev/null) == recheck ]]; then
    assemble qwen2.5-coder-0.5b-instruct-q4_k_m.gguf && recheck 0.5b "$G05"
    assemble qwen2.5-coder-1.5b-instruct-q4_k_m.gguf && recheck 1.5b "$G15"
    SHAPES=qwen3-coder-30b-a3b synthetic
    log "all done"
    exit 0
  fi

  assemble qwen2.5-coder-0.5b-instruct-q4_k_m.gguf && probe "$G05"
  knobs=$(cat "$S/knobs")
  # shellcheck disable=SC2086
  [[ -z $knobs ]] || export $knobs
  real 0.5b "$G05" short

  log "stall: the first request of each new prompt size after laya serve is ready"
  python3 scripts/gpu/first_request.py --laya "$L" --model "$G05" --cases "$XL" --out "$R/stall-0.5b.json" \
    --wrap scripts/gpu/cuda-ops.sh 2>&1 | tail -20
  assemble qwen2.5-coder-1.5b-instruct-q4_k_m.gguf && real 1.5b "$G15" short
  synthetic
  log "all done"
  ;;
*)
  sed -n '2,22p' "$0"
  exit 2
  ;;
esac
