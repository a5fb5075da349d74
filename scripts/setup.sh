#!/usr/bin/env bash
# Sets laya up on this machine and runs its main job on the default model.
#
#   scripts/setup.sh                  # system packages, MLX, build, models, then the demo
#   scripts/setup.sh --no-run         # everything but the demo (what scripts/test.sh uses)
#   scripts/setup.sh --backend cpu    # MLX's CPU backend even where an NVIDIA GPU is found
#                                     # (auto, the default: cuda13 with an NVIDIA driver >= 580,
#                                     # cuda12 with one >= 525, else cpu; also cuda12, cuda13)
#
# With a CUDA backend, `laya models warm` then compiles the GPU kernels MLX builds at first use
# into laya's kernel cache, so the first request of an editor never waits for them.
#
# Idempotent: a second run only checks. Downloads are cached under ${XDG_CACHE_HOME:-~/.cache}/laya.
# Linux: links the prebuilt libmlx of the PyPI wheel mlx-cpu / mlx-cuda-13 (version pinned
# below, it must equal what crates/mlx-sys/mlx-c pins). macOS: MLX builds from source (Metal).
set -euo pipefail

MLX_VERSION=0.32.4          # = GIT_TAG in crates/mlx-sys/mlx-c/CMakeLists.txt
BACKEND=${LAYA_MLX_BACKEND:-auto}
RUN_DEMO=1
FETCH=(qwen2.5-coder-0.5b qwen2.5-coder-1.5b)

while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-run) RUN_DEMO=0 ;;
    --backend) BACKEND="$2"; shift ;;
    --models) IFS=, read -r -a FETCH <<<"$2"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "setup: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

cd "$(dirname "$0")/.."
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
CACHE="${LAYA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/laya}"

# The backend for this machine: MLX's CUDA build when an NVIDIA GPU and its driver answer
# (CUDA 13 needs driver 580 or newer, CUDA 12 525), else the CPU build. Prints the choice's reason.
detect_backend() {
  local gpu driver major
  if ! have nvidia-smi; then
    echo "cpu no NVIDIA driver (nvidia-smi not found)"; return
  fi
  IFS=, read -r gpu driver < <(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  driver=${driver// /}
  if [[ -z $driver ]]; then
    echo "cpu nvidia-smi found no GPU"; return
  fi
  major=${driver%%.*}
  if ((major >= 580)); then
    echo "cuda13 NVIDIA GPU found ($gpu, driver $driver)"
  elif ((major >= 525)); then
    echo "cuda12 NVIDIA GPU found ($gpu, driver $driver; CUDA 13 needs driver 580 or newer)"
  else
    echo "cpu NVIDIA driver $driver is older than MLX's CUDA builds need (525)"
  fi
}
if [[ $BACKEND == auto ]]; then
  if [[ $(uname -s) == Linux ]]; then
    read -r BACKEND why < <(detect_backend)
    say "backend: $BACKEND: $why (--backend cpu|cuda12|cuda13 to choose)"
  else
    BACKEND=cpu # macOS: MLX builds from source with Metal; the variable is Linux's only
  fi
fi
# Unset means cpu to crates/mlx-sys; keep it unset then, so that a later plain `cargo build`
# or `cargo test` sees the same environment and does not rebuild mlx-sys.
if [[ $BACKEND == cpu ]]; then unset LAYA_MLX_BACKEND; else export LAYA_MLX_BACKEND="$BACKEND"; fi

# 1. toolchain -------------------------------------------------------------------------
have cargo || die "Rust is not installed: install it from https://rustup.rs, then re-run this script"
OS=$(uname -s)

if [[ $OS == Linux ]]; then
  # 2. system packages: a C++20 compiler for mlx-c and libclang for bindgen -----------
  need=()
  have g++ || need+=(g++)
  have clang || need+=(clang)
  ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/*/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
  have python3 || need+=(python3)
  python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
  # MLX's CUDA headers, which laya's own GPU primitives include, include fmt's.
  [[ $BACKEND == cpu || -f /usr/include/fmt/format.h ]] || need+=(libfmt-dev)
  if [[ ${#need[@]} -gt 0 ]]; then
    if have apt-get; then
      SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
      say "installing system packages: ${need[*]}"
      $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
    else
      die "missing system packages: ${need[*]} (install them with your package manager)"
    fi
  fi

  # 3. MLX: the wheel's libmlx + headers, unpacked into the cache -----------------------
  case "$BACKEND" in
    cpu) WHEEL=mlx-cpu ;;
    cuda12) WHEEL=mlx-cuda-12 ;;
    cuda13) WHEEL=mlx-cuda-13 ;;
    *) die "unknown backend '$BACKEND' (cpu, cuda12 or cuda13)" ;;
  esac
  MLX_HOME="$CACHE/mlx/$BACKEND-$MLX_VERSION"
  if [[ -f "$MLX_HOME/mlx/lib/libmlx.so" && -f "$MLX_HOME/mlx/include/mlx/version.h" ]]; then
    say "MLX $MLX_VERSION ($BACKEND) present in $MLX_HOME"
  else
    say "installing $WHEEL==$MLX_VERSION into $MLX_HOME"
    rm -rf "$MLX_HOME.tmp"
    # CUDA wheels pull NVIDIA's libraries (~1.5 GiB) next to mlx/, where libmlx's RPATH looks.
    deps=(--no-deps); [[ $BACKEND == cpu ]] || deps=()
    python3 -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
      "${deps[@]}" --target "$MLX_HOME.tmp" "$WHEEL==$MLX_VERSION" \
      || die "pip could not install $WHEEL==$MLX_VERSION (is PyPI reachable?)"
    rm -rf "$MLX_HOME" && mv "$MLX_HOME.tmp" "$MLX_HOME"
  fi
  got=$(awk '/#define MLX_VERSION_(MAJOR|MINOR|PATCH) /{printf "%s.", $3}' "$MLX_HOME/mlx/include/mlx/version.h")
  [[ ${got%.} == "$MLX_VERSION" ]] || die "$MLX_HOME holds MLX ${got%.}, not $MLX_VERSION; delete that folder and re-run"
  # The CUDA headers laya's own GPU primitives compile against (crates/laya-engine/csrc).
  [[ $BACKEND == cpu ]] || scripts/cuda-headers.sh "$BACKEND" "$CACHE" || die "the CUDA headers could not be installed (see above)"
elif [[ $OS == Darwin ]]; then
  have cmake || die "cmake is needed to build MLX from source: brew install cmake"
  xcrun -f metal >/dev/null 2>&1 || say "warning: the Metal compiler was not found (install Xcode); MLX would fall back to the CPU"
else
  die "unsupported OS $OS (laya runs on Linux x86_64 and macOS)"
fi

# 4. build ------------------------------------------------------------------------------
say "building laya (release; the first build takes a few minutes)"
# With --no-run (the test command) build what the tests build: `cargo test --no-run --workspace` also
# makes target/release/laya, and one feature set means the dependencies compile only once.
if [[ $RUN_DEMO == 1 ]]; then BUILD=(build); else BUILD=(test --no-run --workspace); fi
cargo "${BUILD[@]}" --release --locked || die "the build failed (see above); \`laya doctor\` and README.md#troubleshooting help"
LAYA=target/release/laya

# 5. models -----------------------------------------------------------------------------
say "fetching models: ${FETCH[*]}"
"$LAYA" models fetch "${FETCH[@]}"

# 6. GPU kernels ------------------------------------------------------------------------
# MLX's CUDA backend compiles kernels at first use (minutes on a fresh machine): compile them
# now into laya's kernel cache, for the models `laya serve` would serve here.
if [[ $BACKEND == cuda* ]]; then
  say "compiling MLX's GPU kernels for the models laya serves here (laya models warm)"
  "$LAYA" models warm || die "laya models warm failed (see above); \`laya doctor\` says what is missing"
fi

# 7. the main job -----------------------------------------------------------------------
if [[ $RUN_DEMO == 1 ]]; then
  "$LAYA" doctor >/dev/null || "$LAYA" doctor
  say "running: laya complete examples/fib.py:5:1 (the first run converts the model to q8 and caches it)"
  sed -n '1,5p' examples/fib.py | sed 's/^/    | /'
  "$LAYA" complete examples/fib.py:5:1
fi
