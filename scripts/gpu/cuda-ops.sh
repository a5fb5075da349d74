#!/usr/bin/env bash
# Builds the engine's MLX op tests against MLX's CUDA backend here, and runs them on a GPU machine.
#
#   scripts/gpu/cuda-ops.sh build [laya]
#                                   # here (no GPU needed): installs mlx-cuda-13==0.32.4 (no NVIDIA
#                                   # deps: the GPU machine has them), builds the engine's unit tests (crates/
#                                   # laya-engine, whose mlx_ops:: it runs; not with `laya`) and the laya binary
#                                   # into .device/ (debug info stripped) and packs the
#                                   # 135 MiB libmlx.so and its JIT headers (xz) into 40 MiB parts
#                                   # (64 MiB a call)
#   scripts/gpu/cuda-ops.sh run     # on the GPU machine, from the repo root: joins the parts into
#                                   # /tmp/laya-cuda, points the loader at them and at the machine's
#                                   # NVIDIA libraries, runs the tests (mlx_ops::, laya's primitives and the CUDA
#                                   # recurrence kernel's) with LAYA_DEVICE=gpu, then
#                                   # the same binary on the CPU for reference
#   scripts/gpu/cuda-ops.sh stage N # on the GPU machine: copy part N to /tmp/laya-cuda (for
#                                   # transports that carry one part per call)
#   scripts/gpu/cuda-ops.sh bench [SHAPE...]
#                                   # on the GPU machine: libs as for `run`, then `laya bench engine`
#                                   # on synthetic weights of each SHAPE (default: qwen2.5-coder-3b
#                                   # qwen2.5-coder-32b qwen3-coder-30b-a3b) at PRECISIONS (q4,q6,q8), one process per shape;
#                                   # rows to $OUT/bench-h200-SHAPE.jsonl as they come, joined into
#                                   # $OUT/bench-h200.jsonl at the end ($OUT: /tmp if unset)
#   scripts/gpu/cuda-ops.sh wheels  # here: mlx 0.32.4's Python bindings and mlx-lm 0.32.2 into .whl/
#   scripts/gpu/cuda-ops.sh mlx-lm [ARGS...]
#                                   # on the GPU machine: mlx-lm's Qwen3-MoE on random weights of the same
#                                   # shape (scripts/gpu/bench_mlx_lm_moe.py ARGS; with
#                                   # MLX_LM_BENCH=scripts/gpu/bench_qwen35_mlx_lm.py its Qwen3.5 at the
#                                   # 27B's and 4B's shapes), rows to $OUT/bench-h200-mlx-lm.jsonl
#   scripts/gpu/cuda-ops.sh bundle GGUF...
#                                   # here, after `build`: packs the laya binary (xz) and the GGUF
#                                   # files (libmlx's parts too with LAYA_BUNDLE_MLX=1, and the files
#                                   # in LAYA_BUNDLE_EXTRA, unpacked to /tmp) into parts
#                                   # .device/bundle/part.NN, for transports that carry 64 MiB a
#                                   # call with the working tree (one part each): a part is 64 MiB
#                                   # less the tracked files and 2 MiB (LAYA_BUNDLE_PART_MB sets it)
#   scripts/gpu/cuda-ops.sh stage-part NAME
#                                   # on the GPU machine: keep carried part NAME in /tmp/laya-bundle
#   scripts/gpu/cuda-ops.sh unbundle
#                                   # on the GPU machine: joins the parts; laya to .device/laya,
#                                   # libmlx to /tmp/laya-cuda, the GGUF files to /tmp/laya-models,
#                                   # extra files to /tmp
#   scripts/gpu/cuda-ops.sh exec CMD...
#                                   # on the GPU machine: libs as for `run`, then CMD (diagnostics)
#
# Environment for `run` and `bench`: NVIDIA_SITE, the site-packages holding nvidia/{cu13,cudnn,nccl}
# (default: found through python3's torch installation).
set -euo pipefail
cd "$(dirname "$0")/../.."
MLX_VERSION=0.32.4
CACHE="${LAYA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/laya}"
CUDA_HOME_MLX="$CACHE/mlx/cuda13-$MLX_VERSION"
OUTD=.device
STAGE=/tmp/laya-cuda
PART=mlx.tar.xz

# Joins the carried parts in $STAGE (once per machine), points the loader at libmlx and the
# machine's NVIDIA libraries, and checks that binary $1 (if given) resolves every library.
setup_libs() {
  mkdir -p "$STAGE"
  cp "$OUTD/$PART".* "$STAGE/" 2>/dev/null || true
  if [[ ! -f "$STAGE/mlx/lib/libmlx.so" ]]; then
    ls -la "$STAGE"
    if command -v xz >/dev/null; then
      cat "$STAGE/$PART".* | xz -d | tar -C "$STAGE" -xf -
    else
      cat "$STAGE/$PART".* | python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1<<20)' \
        | tar -C "$STAGE" -xf -
    fi
  fi
  local site
  site=${NVIDIA_SITE:-$(python3 -c 'import torch,os; print(os.path.dirname(os.path.dirname(torch.__file__)))')}
  export LD_LIBRARY_PATH="$STAGE/mlx/lib:$STAGE/mlx_cuda_13.libs:$site/nvidia/cu13/lib:$site/nvidia/cudnn/lib:$site/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}"
  if [[ -n "${1:-}" ]] && ldd "$1" | grep 'not found'; then echo "cuda-ops: unresolved libraries (above)" >&2; exit 1; fi
}

# unxz_to FILE.xz OUT: xz where the machine has it, else python3's lzma module.
unxz_to() {
  if command -v xz >/dev/null; then xz -dc "$1"; else
    python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"
  fi >"$2"
}

case "${1:-}" in
build)
  if [[ ! -f "$CUDA_HOME_MLX/mlx/lib/libmlx.so" ]]; then
    python3 -m pip install --quiet --no-deps --only-binary=:all: --target "$CUDA_HOME_MLX" "mlx-cuda-13==$MLX_VERSION"
  fi
  scripts/cuda-headers.sh cuda13 "$CACHE"
  [[ -f /usr/include/fmt/format.h ]] || { echo "cuda-ops: install libfmt-dev (MLX's CUDA headers include fmt)" >&2; exit 1; }
  # libmlx.so's CUDA dependencies (cublasLt, cudnn, nccl, libcuda) exist only on the GPU
  # machine; let the linker leave them to the loader there.
  export LAYA_MLX_BACKEND=cuda13 CARGO_TARGET_DIR=target/cuda
  export RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined"
  # Diagnostics go to stderr (rendered); only the JSON artifact lines are parsed.
  bin=
  if [[ "${2:-}" != laya ]]; then
    json=$(cargo test --release --locked --no-run -p laya-engine --lib --message-format=json-render-diagnostics) \
      || { echo "cuda-ops: cargo build failed (see the errors above)" >&2; exit 1; }
    bin=$(python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="laya_engine" and m["profile"]["test"]: print(m["executable"])' <<<"$json" | tail -1)
    [[ -x "$bin" ]] || { echo "cuda-ops: no engine test executable in cargo's output" >&2; exit 1; }
  fi
  cargo build --release --locked --bin laya \
    || { echo "cuda-ops: cargo build of laya failed (see the errors above)" >&2; exit 1; }
  # libmlx's parts are kept when they are newer than the libmlx they pack (a rebuild of
  # laya's code alone skips the ~3 minutes of packing).
  keep=
  [[ -f "$OUTD/$PART.aa" && "$OUTD/$PART.aa" -nt "$CUDA_HOME_MLX/mlx/lib/libmlx.so" ]] && keep=1
  if [[ -n $keep ]]; then
    find "$OUTD" -mindepth 1 -maxdepth 1 ! -name "$PART.*" -exec rm -rf {} +
  else
    rm -rf "$OUTD" && mkdir -p "$OUTD"
  fi
  # Debug info is ~45 MB of the binary; symbols stay for backtraces.
  [[ -z "$bin" ]] || strip --strip-debug -o "$OUTD/mlx_ops" "$bin"
  strip --strip-debug -o "$OUTD/laya" "$CARGO_TARGET_DIR/release/laya"
  # libmlx.so, its bundled BLAS/LAPACK, and the CCCL/CUTLASS/CuTe headers that MLX's NVRTC
  # kernels include at run time (found at <dir of libmlx.so>/../include; without them the
  # quantized matmul for M > 16 fails with "cannot open source file cute/..."), split under
  # the 64 MiB carry limit. xz, not zstd: the GPU machine has no zstd (seen), while xz or
  # python3's lzma module can unpack xz.
  [[ -n $keep ]] || tar -C "$CUDA_HOME_MLX" -cf - mlx/lib/libmlx.so mlx/include mlx_cuda_13.libs | xz -9 -T2 | split -b 40m - "$OUTD/$PART."
  # The binaries compressed for carrying beside a part (`xz -d` or python3's lzma there).
  for b in laya mlx_ops; do [[ ! -f "$OUTD/$b" ]] || xz -T2 -3 -c "$OUTD/$b" >"$OUTD/$b.xz"; done
  ls -la "$OUTD"
  ;;
stage)
  mkdir -p "$STAGE" && cp "$OUTD/$PART.$2" "$STAGE/"
  ;;
run)
  setup_libs "$OUTD/mlx_ops"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  # Evidence that the GPU is used: sample the GPU's compute processes while the tests run.
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader -lms 100 >/tmp/laya-cuda-apps.txt 2>&1 &
  smi=$!
  rc=0
  echo "== mlx_ops, LAYA_DEVICE=gpu"
  LAYA_DEVICE=gpu "$OUTD/mlx_ops" mlx_ops:: qwen35::tests::the_cuda_kernel models::rope_kv:: models::step:: --test-threads=1 --nocapture 2>&1 || rc=$?
  kill "$smi" 2>/dev/null || true
  echo "== GPU compute processes seen during the GPU run:"
  sed 's/^/  /' /tmp/laya-cuda-apps.txt | sort | uniq -c
  echo "== mlx_ops, LAYA_DEVICE=cpu (same binary and libmlx, for reference)"
  LAYA_DEVICE=cpu "$OUTD/mlx_ops" mlx_ops:: --test-threads=1 --nocapture 2>&1 || true
  exit "$rc"
  ;;
bench)
  shift
  setup_libs "$OUTD/laya"
  out=${OUT:-/tmp}
  shapes=("$@")
  [[ ${#shapes[@]} -gt 0 ]] || shapes=(qwen2.5-coder-3b qwen2.5-coder-32b qwen3-coder-30b-a3b)
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
  # Evidence that the GPU is used: sample the GPU's compute processes while the benches run.
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader -lms 200 >/tmp/laya-cuda-apps.txt 2>&1 &
  smi=$!
  rc=0
  # One process per shape, each writing its rows as they come to its own file: a run stopped at
  # the call's limit keeps every finished row. MLX's JIT cache (/tmp/mlx) carries over.
  for shape in "${shapes[@]}"; do
    echo "== laya bench engine --synthetic $shape ($(date +%T))"
    "$OUTD/laya" --device gpu bench engine --synthetic "$shape" --precision "${PRECISIONS:-q4,q6,q8}" \
      --prefill 128,512,2048 --decode 64 --json "$out/bench-h200-$shape.jsonl" || rc=$?
  done
  echo "== done ($(date +%T))"
  kill "$smi" 2>/dev/null || true
  for shape in "${shapes[@]}"; do cat "$out/bench-h200-$shape.jsonl" 2>/dev/null || true; done >"$out/bench-h200.jsonl"
  echo "== GPU compute processes seen during the runs (last sample per process):"
  awk -F, '{last[$1]=$0} END {for (p in last) print "  " last[p]}' /tmp/laya-cuda-apps.txt
  echo "== JSON rows ($out/bench-h200.jsonl):"
  cat "$out/bench-h200.jsonl"
  exit "$rc"
  ;;
wheels)
  # Here: the wheels `mlx-lm` needs there, into .whl/ (ignored by git; carry it): mlx's Python
  # bindings of laya's MLX, and mlx-lm 0.32.2 (the newest; it passes gather_qmm the
  # global_scale MLX 0.32.4 has). The GPU machine's Python is 3.12.
  rm -rf .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d .whl "mlx==$MLX_VERSION" "mlx-lm==0.32.2"
  ls -la .whl
  ;;
mlx-lm)
  # mlx-lm's own model on the same GPU (the peer row): mlx's Python bindings (the same MLX version)
  # and mlx-lm from the wheels `wheels` put in .whl/, their libmlx the carried one.
  shift
  setup_libs
  site=/tmp/mlx-site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/mlx-*.whl .whl/mlx_lm-*.whl
  for d in lib include; do rm -rf "${site:?}/mlx/$d" && ln -s "$STAGE/mlx/$d" "$site/mlx/$d"; done
  out=${OUT:-/tmp}
  # MLX_LM_BENCH=scripts/gpu/bench_qwen35_mlx_lm.py for the Qwen3.5 shapes.
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" python3 "${MLX_LM_BENCH:-scripts/gpu/bench_mlx_lm_moe.py}" \
    --json "$out/bench-h200-mlx-lm.jsonl" "$@"
  ;;
bundle)
  shift
  [[ -x "$OUTD/laya" ]] || { echo "cuda-ops: run \`scripts/gpu/cuda-ops.sh build\` first" >&2; exit 1; }
  work=$(mktemp -d)
  xz -T2 -6 -c "$OUTD/laya" >"$work/laya.xz"
  # libmlx's parts go separately (`stage aa`, `stage ab`) unless asked for here.
  [[ -z "${LAYA_BUNDLE_MLX:-}" ]] || cp "$OUTD/$PART".* "$work/"
  # Extra files (e.g. a test binary), xz-compressed into the bundle.
  for f in ${LAYA_BUNDLE_EXTRA:-}; do xz -T2 -6 -c "$f" >"$work/$(basename "$f").xz"; done
  mkdir -p "$work/models"
  for g in "$@"; do ln -s "$(realpath "$g")" "$work/models/$(basename "$g")"; done
  rm -rf "$OUTD/bundle" && mkdir -p "$OUTD/bundle"
  tree_mb=$(( ($(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) + 1048575) / 1048576 ))
  part_mb=${LAYA_BUNDLE_PART_MB:-$((64 - tree_mb - 2))}
  echo "cuda-ops: tracked files ${tree_mb} MiB, parts of ${part_mb} MiB"
  tar -C "$work" -chf - . | split -b "${part_mb}m" -d - "$OUTD/bundle/part."
  rm -rf "$work"
  ls -la "$OUTD/bundle"
  ;;
stage-part)
  mkdir -p /tmp/laya-bundle && cp "$OUTD/bundle/$2" /tmp/laya-bundle/
  ;;
unbundle)
  b=/tmp/laya-bundle
  cat "$b"/part.* | tar -C "$b" -xf -
  mkdir -p "$STAGE" /tmp/laya-models "$OUTD"
  cp "$b/$PART".* "$STAGE/" 2>/dev/null || true
  mv "$b"/models/* /tmp/laya-models/ 2>/dev/null || true
  for x in "$b"/*.xz; do
    [[ "$x" == "$b/laya.xz" ]] && continue
    unxz_to "$x" "/tmp/$(basename "$x" .xz)" && chmod +x "/tmp/$(basename "$x" .xz)"
  done
  unxz_to "$b/laya.xz" "$OUTD/laya.new"
 mv "$OUTD/laya.new" "$OUTD/laya" && chmod +x "$OUTD/laya"
  ls -la "$STAGE" /tmp/laya-models "$OUTD/laya"
  ;;
exec)
  shift
  setup_libs
  exec "$@"
  ;;
*)
  awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2 ;;
esac
