#!/usr/bin/env bash
# Greedy text of two laya builds on the reference prompts (tests/data/reference-0.5b.json):
# each build serves the 0.5B at q8 on the CPU, every prompt goes to /v1/completions as is
# (24 tokens, temperature 0), and the texts are compared. For a change to the model's graph
# that must leave its tokens as they were.
#
#   scripts/compare_greedy.sh BUILD_A BUILD_B     # e.g. /tmp/laya-before target/release/laya
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { # run BIN TAG PORT
  XDG_RUNTIME_DIR="$work/rt-$2" "$1" serve --device cpu --small qwen2.5-coder-0.5b --large none \
    --precision q8 --http-addr "127.0.0.1:$3" --speculation off >"$work/serve-$2.log" 2>&1 &
  local serve=$!
  # shellcheck disable=SC2064
  trap "kill $serve 2>/dev/null" RETURN
  python3 - "$3" "$work/$2.json" <<'PY'
import json, sys, time, urllib.request
port, out = sys.argv[1:]
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        break
    except Exception:
        time.sleep(1)
texts = []
for p in json.load(open("tests/data/reference-0.5b.json"))["prompts"]:
    body = json.dumps({"prompt": p["prompt"], "max_tokens": 24, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    texts.append({"name": p["name"], "text": json.load(urllib.request.urlopen(req, timeout=900))["choices"][0]["text"]})
json.dump(texts, open(out, "w"), indent=1)
PY
}
run "$1" a 18431 & run "$2" b 18432 & wait
python3 - "$work/a.json" "$work/b.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
same = [x["name"] for x, y in zip(a, b) if x["text"] == y["text"]]
for x, y in zip(a, b):
    print(f"{x['name']:<18} {'same' if x['text'] == y['text'] else 'DIFFERENT'} {x['text']!r}" + ("" if x["text"] == y["text"] else f" / {y['text']!r}"))
print(f"{len(same)} of {len(a)} prompts give the same greedy text")
sys.exit(0 if len(same) == len(a) else 1)
PY
