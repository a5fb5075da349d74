#!/usr/bin/env bash
# End-to-end test of the Neovim plugin in a real headless Neovim (see e2e.lua).
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
cleanup() { stop_stub; rm -rf "$work"; }
trap cleanup EXIT
: > "$ARTIFACTS/neovim-stub-requests.jsonl"
start_stub "$ARTIFACTS/neovim-stub-requests.jsonl"
export NVIM_BIN LAYA_BIN ARTIFACTS WORK="$work" LAYA_REMOTE_URL="$STUB_URL"
timeout 120 "$NVIM_BIN" --clean --headless -n -i NONE -l "$here/e2e.lua"
