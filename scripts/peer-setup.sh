#!/usr/bin/env bash
# Sets up the llama.cpp peer that scripts/bench_llama_cpp.py measures laya against: a venv
# with llama-cpp-python 0.3.36 (built from its PyPI sdist, native CPU flags), its [server]
# extras, and gguf. Prints the venv's python as the last line.
#
#   scripts/peer-setup.sh            # ~6+ min on 2 cores the first time, then only checks
#
# Venv: ${LAYA_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/laya}/peer-venv. Idempotent.
# CMAKE_BUILD_PARALLEL_LEVEL (default 2) sets the build's jobs; the build runs under nice -n 10.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
GGUF_VERSION=0.19.0

say() { printf '\033[1m[peer-setup]\033[0m %s\n' "$*" >&2; }
die() { printf '[peer-setup] ERROR: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

CACHE="${LAYA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/laya}"
VENV="$CACHE/peer-venv"
PY="$VENV/bin/python"

check() {
  "$PY" - "$LLAMA_CPP_PYTHON_VERSION" <<'EOF' >/dev/null 2>&1
import sys, llama_cpp, gguf
assert llama_cpp.__version__ == sys.argv[1], llama_cpp.__version__
EOF
}

if [[ -x $PY ]] && check; then
  say "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION present in $VENV"
  echo "$PY"
  exit 0
fi

# Build tools (as in /work/shared/models/MODELS.md). Without apt, pip's build falls back to the
# cmake/ninja wheels from PyPI; a C/C++ compiler is needed either way.
need=()
have cmake || need+=(cmake)
have ninja || need+=(ninja-build)
{ have cc && have c++ && have make; } || need+=(build-essential)
if [[ ${#need[@]} -gt 0 ]]; then
  if have apt-get; then
    SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
    say "installing system packages: ${need[*]}"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  elif ! have c++; then
    die "no C++ compiler: install one (and cmake, ninja) with your package manager"
  fi
fi

have python3 || die "python3 is not installed"
if [[ ! -x $PY ]] || ! "$PY" -m pip --version >/dev/null 2>&1; then
  say "creating venv $VENV"
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV" || die "python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)"
fi

say "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from its sdist (takes ~6+ min on 2 cores)"
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
nice -n 10 "$PY" -m pip install --disable-pip-version-check --no-binary llama-cpp-python \
  "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" "gguf==$GGUF_VERSION" \
  || die "pip could not build/install llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (is PyPI reachable? see the output above)"

check || die "llama_cpp $LLAMA_CPP_PYTHON_VERSION or gguf does not import in $VENV"
say "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION installed in $VENV"
echo "$PY"
