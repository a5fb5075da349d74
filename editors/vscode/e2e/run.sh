#!/usr/bin/env bash
# End-to-end test of the VS Code extension (see e2e.mjs): installs the .vsix into a fresh
# code-server, starts it on a free port with laya's remote tier on the stub OpenAI server, and
# runs the Playwright script.
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
cleanup() {
  if [ -n "$cs_pid" ]; then kill "$cs_pid" 2>/dev/null || true; wait "$cs_pid" 2>/dev/null || true; fi
  stop_stub
  rm -rf "$work"
}
trap cleanup EXIT
: > "$ARTIFACTS/vscode-stub-requests.jsonl"
start_stub "$ARTIFACTS/vscode-stub-requests.jsonl"

code_server="$E2E_NODE_MODULES/.bin/code-server"
workspace="$work/project"
mkdir -p "$workspace" "$work/data/User" "$work/extensions"
printf '# laya end-to-end test\n' > "$workspace/main.py"
cat > "$work/data/User/settings.json" <<JSON
{
  "laya.path": "$LAYA_BIN",
  "laya.remote.url": "$STUB_URL",
  "laya.completion.debounceMs": 10,
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
printf 'bind-addr: 127.0.0.1:0\nauth: none\ncert: false\n' > "$work/config.yaml"
export XDG_CONFIG_HOME="$work/xdg-config" XDG_DATA_HOME="$work/xdg-data"

"$code_server" --config "$work/config.yaml" --user-data-dir "$work/data" --extensions-dir "$work/extensions" \
  --install-extension "$VSIX" > "$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$code_server" --config "$work/config.yaml" --user-data-dir "$work/data" --extensions-dir "$work/extensions" \
  --bind-addr "127.0.0.1:$port" --auth none --disable-telemetry --disable-update-check \
  --disable-workspace-trust --disable-getting-started-override "$workspace" > "$ARTIFACTS/vscode-code-server.log" 2>&1 &
cs_pid=$!
for _ in $(seq 300); do
  curl -fsS "http://127.0.0.1:$port/healthz" > /dev/null 2>&1 && break
  kill -0 "$cs_pid" 2>/dev/null || { echo "code-server exited:"; cat "$ARTIFACTS/vscode-code-server.log"; exit 1; }
  sleep 0.2
done

CODE_SERVER_URL="http://127.0.0.1:$port" WORKSPACE="$workspace" ARTIFACTS="$ARTIFACTS" \
  E2E_NODE_MODULES="$E2E_NODE_MODULES" timeout 300 node "$here/e2e.mjs"
