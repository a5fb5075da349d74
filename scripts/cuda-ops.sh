#!/usr/bin/env bash
# Builds laya's MLX op tests against MLX's CUDA backend here, and runs them on a GPU machine.
#
#   scripts/cuda-ops.sh build   # here (no GPU needed): installs mlx-cuda-13==0.32.2 (no NVIDIA
#                               # deps: the GPU machine has them), builds tests/mlx_ops.rs into
#                               # .device/ and splits the 135 MiB libmlx.so into parts < 64 MiB
#   scripts/cuda-ops.sh run     # on the GPU machine, from the repo root: joins the parts into
#                               # /tmp/laya-cuda, points the loader at them and at the machine's
#                               # NVIDIA libraries, runs the tests with LAYA_DEVICE=gpu
#   scripts/cuda-ops.sh stage N # on the GPU machine: copy part N to /tmp/laya-cuda (for
#                               # transports that carry one part per call)
#
# Environment for `run`: NVIDIA_SITE, the site-packages holding nvidia/{cu13,cudnn,nccl}
# (default: found through python3's torch installation).
set -euo pipefail
cd "$(dirname "$0")/.."
MLX_VERSION=0.32.2
CACHE="${LAYA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/laya}"
CUDA_HOME_MLX="$CACHE/mlx/cuda13-$MLX_VERSION"
OUTD=.device
STAGE=/tmp/laya-cuda

case "${1:-}" in
build)
  if [[ ! -f "$CUDA_HOME_MLX/mlx/lib/libmlx.so" ]]; then
    python3 -m pip install --quiet --no-deps --only-binary=:all: --target "$CUDA_HOME_MLX" "mlx-cuda-13==$MLX_VERSION"
  fi
  # libmlx.so's CUDA dependencies (cublasLt, cudnn, nccl, libcuda) exist only on the GPU
  # machine; let the linker leave them to the loader there.
  export LAYA_MLX_BACKEND=cuda13 CARGO_TARGET_DIR=target/cuda
  export RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined"
  bin=$(cargo test --release --locked --no-run --test mlx_ops --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="mlx_ops": print(m["executable"])' | tail -1)
  [[ -x "$bin" ]] || { echo "build failed: run the cargo command above without --message-format" >&2; exit 1; }
  rm -rf "$OUTD" && mkdir -p "$OUTD"
  cp "$bin" "$OUTD/mlx_ops"
  # libmlx.so plus its bundled BLAS/LAPACK, zstd-compressed, split under the 64 MiB carry limit.
  tar -C "$CUDA_HOME_MLX" -cf - mlx/lib/libmlx.so mlx_cuda_13.libs | zstd -q -19 -T2 | split -b 40m - "$OUTD/mlx.tar.zst."
  ls -la "$OUTD"
  ;;
stage)
  mkdir -p "$STAGE" && cp ".device/mlx.tar.zst.$2" "$STAGE/"
  ;;
run)
  mkdir -p "$STAGE"
  cp .device/mlx.tar.zst.* "$STAGE/" 2>/dev/null || true
  if [[ ! -f "$STAGE/mlx/lib/libmlx.so" ]]; then
    cat "$STAGE"/mlx.tar.zst.* | zstd -d -q | tar -C "$STAGE" -xf -
  fi
  site=${NVIDIA_SITE:-$(python3 -c 'import torch,os; print(os.path.dirname(os.path.dirname(torch.__file__)))')}
  export LD_LIBRARY_PATH="$STAGE/mlx/lib:$STAGE/mlx_cuda_13.libs:$site/nvidia/cu13/lib:$site/nvidia/cudnn/lib:$site/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  LAYA_DEVICE=gpu .device/mlx_ops --test-threads=1 --nocapture 2>&1
  ;;
*)
  sed -n '2,16p' "$0"; exit 2 ;;
esac
