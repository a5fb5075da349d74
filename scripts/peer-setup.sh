#!/usr/bin/env bash
# Sets up the llama.cpp peer that scripts/bench_llama_cpp.py measures laya against and that
# tests/it/remote_llama_cpp.rs serves a tier from: a venv with llama-cpp-python 0.3.36 (built from
# its PyPI sdist for this CPU), its [server] extras, and gguf. Prints the venv's python as the
# last line.
#
#   scripts/peer-setup.sh                 # ~8 min on 2 cores the first time, then only checks
#   scripts/peer-setup.sh --model FILE    # the GGUF the check completes with
#
# The check is a real completion, not an import: the venv's llama_cpp loads a GGUF (default: the
# 0.5B in laya's model directory) and generates one token in a child process. A venv that fails
# it (missing, another version, or a build that crashes on this CPU) is removed and built again;
# a fresh build that fails it is an error, with the crash's output.
#
# The build: ggml's CPU code for the instruction sets this CPU reports (AVX, AVX2, FMA, F16C,
# BMI2, AVX-512 with VBMI/VNNI/BF16 where present), never ggml's AMX code: on machines whose CPU
# advertises amx_tile/amx_int8 the AMX matmul crashed on the first completion
# (ggml_backend_amx_mul_mat). So not GGML_NATIVE (-march=native turns AMX on wherever the CPU
# lists it). pip builds with --no-cache-dir: its wheel cache would otherwise hand back a wheel
# built earlier with other CMAKE_ARGS. CMAKE_ARGS from the environment come last and win.
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
MODEL="${LAYA_MODEL_DIR:-$CACHE/models}/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
[[ -f $MODEL ]] || die "no model to check the peer with at $MODEL: run \`target/release/laya models fetch qwen2.5-coder-0.5b\` (scripts/setup.sh does), or pass --model FILE.gguf"

# Prints why the venv is not usable; nothing when it is. The completion runs in a child python
# so that a crash (SIGSEGV, SIGILL) is a failed check, not the end of this script.
problem() {
  [[ -x $PY ]] || { echo "no venv"; return; }
  local out rc=0
  out=$("$PY" - "$LLAMA_CPP_PYTHON_VERSION" "$MODEL" 2>&1 <<'PYEOF'
import sys
import llama_cpp, gguf  # noqa: F401
assert llama_cpp.__version__ == sys.argv[1], f"llama_cpp {llama_cpp.__version__}, want {sys.argv[1]}"
llm = llama_cpp.Llama(model_path=sys.argv[2], n_ctx=256, n_threads=1, verbose=False)
out = llm.create_completion("def fibonacci(n):", max_tokens=1, temperature=0.0)
assert out["usage"]["completion_tokens"] == 1, out
print("ok")
PYEOF
  ) || rc=$?
  if ((rc > 128)); then
    echo "the check was killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))${out:+: }$(tail -n 15 <<<"$out")"
  elif ((rc != 0)); then
    echo "the check failed (exit status $rc)${out:+: }$(tail -n 15 <<<"$out")"
  fi
}

why=$(problem)
if [[ -z $why ]]; then
  say "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION present in $VENV (one-token completion checked)"
  echo "$PY"
  exit 0
fi
[[ -x $PY ]] && say "the venv in $VENV fails its check, building it again: $why"

# Build tools (as in the shared MODELS.md). Without apt, pip's build falls back to the
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
say "creating venv $VENV"
rm -rf "$VENV"
mkdir -p "$CACHE"
python3 -m venv "$VENV" || die "python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)"

# ggml's x86 options for what this CPU has (Linux: /proc/cpuinfo; elsewhere ggml's defaults).
cpu_flags=()
if [[ $(uname -m) == x86_64 && -r /proc/cpuinfo ]]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  on() { [[ $flags == *" $1 "* ]] && echo ON || echo OFF; }
  cpu_flags=(-DGGML_AVX="$(on avx)" -DGGML_AVX2="$(on avx2)" -DGGML_FMA="$(on fma)" -DGGML_F16C="$(on f16c)"
    -DGGML_BMI2="$(on bmi2)" -DGGML_AVX512="$(on avx512f)" -DGGML_AVX512_VBMI="$(on avx512vbmi)"
    -DGGML_AVX512_VNNI="$(on avx512_vnni)" -DGGML_AVX512_BF16="$(on avx512_bf16)" -DGGML_AVX_VNNI="$(on avx_vnni)")
fi
export CMAKE_ARGS="-DGGML_NATIVE=OFF ${cpu_flags[*]} -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
say "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from its sdist (~8 min on 2 cores): $CMAKE_ARGS"
nice -n 10 "$PY" -m pip install --disable-pip-version-check --no-cache-dir --no-binary llama-cpp-python \
  "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" "gguf==$GGUF_VERSION" \
  || die "pip could not build/install llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (is PyPI reachable? see the output above)"

why=$(problem)
[[ -z $why ]] || die "the llama-cpp-python just built in $VENV fails a one-token completion of $MODEL:
$why"
say "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION installed in $VENV (one-token completion checked)"
echo "$PY"
