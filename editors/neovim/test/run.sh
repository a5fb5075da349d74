#!/usr/bin/env bash
# End-to-end test of the Neovim plugin in a real headless Neovim (see e2e.lua): once from a
# cold daemon (the real 0.5B loading), then on the stub OpenAI server.
# Environment: NVIM_BIN (Neovim 0.11+; default nvim), LAYA_BIN (default target/release/laya),
# ARTIFACTS (where the stub's request log goes; default target/editor-artifacts).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
NVIM_BIN="${NVIM_BIN:-nvim}"
LAYA_BIN="$(realpath "${LAYA_BIN:-$root/target/release/laya}")"
ARTIFACTS="${ARTIFACTS:-$root/target/editor-artifacts}"
mkdir -p "$ARTIFACTS"
. "$root/editors/testing/lib.sh"

work="$(mktemp -d)"
cold_daemon() { cat "$work/cold/rt/laya.pid" 2> /dev/null; }
cleanup() {
  stop_stub
  if [ -n "$(cold_daemon)" ]; then kill "$(cold_daemon)" 2> /dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
export NVIM_BIN LAYA_BIN ARTIFACTS

# 1. From a cold daemon: a runtime directory of its own, where no daemon runs; `laya lsp` starts
#    one, which loads the real 0.5B (`laya models fetch qwen2.5-coder-0.5b`) while the first
#    request waits for it.
echo "cold daemon (laya lsp starts it; the real 0.5B loads on the CPU)"
mkdir -p "$work/cold/rt" && chmod 700 "$work/cold/rt"
LAYA_RUNTIME_DIR="$work/cold/rt" LAYA_E2E_COLD=1 WORK="$work/cold" \
  timeout 420 "$NVIM_BIN" --clean --headless -n -i NONE -l "$here/e2e.lua"
if [ -z "$(cold_daemon)" ]; then
  echo "FAILED: laya lsp started no daemon in $work/cold/rt"
  exit 1
fi

# 2. The stub's answers through `laya lsp --remote-url`.
echo "remote tier (the stub OpenAI server)"
: > "$ARTIFACTS/neovim-stub-requests.jsonl"
start_stub "$ARTIFACTS/neovim-stub-requests.jsonl"
mkdir -p "$work/warm"
LAYA_REMOTE_URL="$STUB_URL" WORK="$work/warm" \
  timeout 120 "$NVIM_BIN" --clean --headless -n -i NONE -l "$here/e2e.lua"
