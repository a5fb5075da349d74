#!/usr/bin/env bash
# Installs the CUDA headers a CUDA build of laya compiles its own GPU primitives against
# (crates/laya-engine/csrc: cuda.h and cuda_runtime.h, which MLX's CUDA headers include),
# from NVIDIA's PyPI wheels: headers only, no toolkit, no compiler (the kernels compile at run
# time with the NVRTC MLX loads). Used by scripts/setup.sh and scripts/gpu/cuda-ops.sh.
#
#   scripts/cuda-headers.sh BACKEND CACHE   # BACKEND cuda12 or cuda13; into CACHE/cuda/BACKEND/include
#
# crates/laya-engine/build.rs looks there. Idempotent.
set -euo pipefail
backend=$1
include="$2/cuda/$backend/include"
[[ -f "$include/cuda.h" && -f "$include/crt/host_config.h" ]] && exit 0
case "$backend" in
  # CUDA 13.0: what driver 580 runs; crt/ is a wheel of its own from 13 on.
  cuda13) pkgs=("nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*") ;;
  cuda12) pkgs=("nvidia-cuda-runtime-cu12==12.9.*" "nvidia-cuda-nvcc-cu12==12.9.*") ;;
  *) echo "cuda-headers: unknown backend '$backend' (cuda12 or cuda13)" >&2; exit 2 ;;
esac
tmp="$2/cuda/$backend.tmp"
rm -rf "$tmp" "$include.new"
python3 -m pip install --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
  --target "$tmp" "${pkgs[@]}" \
  || { echo "cuda-headers: pip could not install ${pkgs[*]} (is PyPI reachable?)" >&2; exit 1; }
mkdir -p "$include.new"
for d in "$tmp"/nvidia/*/include; do cp -r "$d"/. "$include.new"/; done
rm -rf "$include" && mv "$include.new" "$include" && rm -rf "$tmp"
[[ -f "$include/cuda.h" && -f "$include/crt/host_config.h" ]] \
  || { echo "cuda-headers: ${pkgs[*]} did not give cuda.h and crt/host_config.h" >&2; exit 1; }
echo "cuda-headers: CUDA headers for $backend in $include"
