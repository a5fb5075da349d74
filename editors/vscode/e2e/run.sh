#!/usr/bin/env bash
# End-to-end test of the VS Code extension (see e2e.mjs): installs the .vsix into a fresh
# code-server, starts it on a free port and runs the Playwright script; once from a cold daemon
# (laya lsp starts it, the real 0.5B loads), then with laya's remote tier on the stub OpenAI
# server.
# Environment: VSIX (the packaged extension), E2E_NODE_MODULES (node_modules with code-server
# and playwright-core), LAYA_BIN (default target/release/laya), ARTIFACTS (default
# target/editor-artifacts), CHROMIUM (default /usr/bin/chromium).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
LAYA_BIN="$(realpath "${LAYA_BIN:-$root/target/release/laya}")"
ARTIFACTS="${ARTIFACTS:-$root/target/editor-artifacts}"
: "${VSIX:?VSIX: the packaged extension}" "${E2E_NODE_MODULES:?E2E_NODE_MODULES}"
mkdir -p "$ARTIFACTS"
. "$root/editors/testing/lib.sh"

work="$(mktemp -d)"
cs_pid=
cold_daemon() { cat "$work/cold/rt/laya.pid" 2> /dev/null; }
stop_code_server() {
  if [ -n "$cs_pid" ]; then kill "$cs_pid" 2>/dev/null || true; wait "$cs_pid" 2>/dev/null || true; fi
  cs_pid=
}
cleanup() {
  stop_code_server
  stop_stub
  if [ -n "$(cold_daemon)" ]; then kill "$(cold_daemon)" 2> /dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
: > "$ARTIFACTS/vscode-stub-requests.jsonl"
start_stub "$ARTIFACTS/vscode-stub-requests.jsonl"
code_server="$E2E_NODE_MODULES/.bin/code-server"

# run_e2e NAME SETTINGS: a fresh code-server in $work/NAME with the extension installed and
# laya's SETTINGS (JSON lines of settings.json), then e2e.mjs against it.
run_e2e() {
  local name="$1" laya_settings="$2" dir="$work/$1"
  local workspace="$dir/project"
  mkdir -p "$workspace" "$dir/data/User" "$dir/extensions"
  printf '# laya end-to-end test\n' > "$workspace/main.py"
  cat > "$dir/data/User/settings.json" <<JSON
{
  "laya.path": "$LAYA_BIN",
  $laya_settings
  "editor.inlineSuggest.enabled": true,
  "editor.quickSuggestions": { "other": "off", "comments": "off", "strings": "off" },
  "editor.suggestOnTriggerCharacters": false,
  "editor.autoIndent": "full",
  "files.autoSave": "off",
  "security.workspace.trust.enabled": false,
  "workbench.startupEditor": "none",
  "workbench.tips.enabled": false,
  "workbench.enableExperiments": false,
  "telemetry.telemetryLevel": "off",
  "update.mode": "none",
  "extensions.autoCheckUpdates": false,
  "extensions.autoUpdate": false,
  "extensions.ignoreRecommendations": true
}
JSON
  printf 'bind-addr: 127.0.0.1:0\nauth: none\ncert: false\n' > "$dir/config.yaml"
  export XDG_CONFIG_HOME="$dir/xdg-config" XDG_DATA_HOME="$dir/xdg-data"

  "$code_server" --config "$dir/config.yaml" --user-data-dir "$dir/data" --extensions-dir "$dir/extensions" \
    --install-extension "$VSIX" > "$dir/install.log" 2>&1 || { cat "$dir/install.log"; return 1; }

  local port
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$code_server" --config "$dir/config.yaml" --user-data-dir "$dir/data" --extensions-dir "$dir/extensions" \
    --bind-addr "127.0.0.1:$port" --auth none --disable-telemetry --disable-update-check \
    --disable-workspace-trust --disable-getting-started-override "$workspace" > "$ARTIFACTS/vscode-$name-code-server.log" 2>&1 &
  cs_pid=$!
  for _ in $(seq 300); do
    curl -fsS "http://127.0.0.1:$port/healthz" > /dev/null 2>&1 && break
    kill -0 "$cs_pid" 2>/dev/null || { echo "code-server exited:"; cat "$ARTIFACTS/vscode-$name-code-server.log"; return 1; }
    sleep 0.2
  done

  local rc=0
  CODE_SERVER_URL="http://127.0.0.1:$port" WORKSPACE="$workspace" ARTIFACTS="$ARTIFACTS" \
    E2E_NODE_MODULES="$E2E_NODE_MODULES" timeout 600 node "$here/e2e.mjs" || rc=$?
  stop_code_server
  return "$rc"
}

# 1. From a cold daemon: a runtime directory of its own, where no daemon runs; `laya lsp` starts
#    one, which loads the real 0.5B (`laya models fetch qwen2.5-coder-0.5b`) while the first
#    request waits for it. Few tokens: the CPU decodes ~0.6 s a token.
echo "cold daemon (laya lsp starts it; the real 0.5B loads on the CPU)"
mkdir -p "$work/cold/rt" && chmod 700 "$work/cold/rt"
LAYA_RUNTIME_DIR="$work/cold/rt" E2E_COLD=1 run_e2e cold '"laya.extraArgs": ["--small", "qwen2.5-coder-0.5b", "--large", "none", "--device", "cpu", "--no-http"],
  "laya.completion.debounceMs": 10,
  "laya.completion.maxTokensLine": 4,
  "laya.completion.maxTokensBlock": 4,'
if [ -z "$(cold_daemon)" ]; then
  echo "FAILED: laya lsp started no daemon in $work/cold/rt"
  exit 1
fi

# 2. The stub's answers through `laya lsp --remote-url`.
echo "remote tier (the stub OpenAI server)"
run_e2e warm "\"laya.remote.url\": \"$STUB_URL\",
  \"laya.completion.debounceMs\": 10,"
