#!/usr/bin/env python3
"""The first request of each new prompt size after `laya serve` reports ready.

Starts `laya serve` on one model (HTTP on loopback, no large tier), waits until /health says
every model is ready and warm, then sends fill-in-the-middle requests to POST /complete whose
prompts grow through sizes never sent before (about 150 to 3,800 tokens; text from the case
file, so every request is new text), each followed by a second request of the same size and
other text. A stall is the first request's time over the second's.

  python3 scripts/gpu/first_request.py --laya target/release/laya --model GGUF --cases C \
      [--wrap scripts/gpu/cuda-ops.sh] [--out stall.json]

--wrap runs laya through `WRAP exec` (the GPU machine's library set-up).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_infill import free_port, post  # noqa: E402

SIZES = [150, 400, 700, 1100, 1500, 2000, 2600, 3200, 3800]


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())


def timed_post(base, body):
    """POST /complete; returns (ms, the answer)."""
    t = time.perf_counter()
    out = post(base, "/complete", body, timeout=600)
    return (time.perf_counter() - t) * 1000, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--laya", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--wrap")
    ap.add_argument("--out")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--device", default="gpu", help="laya's --device (cpu: to check this script)")
    ap.add_argument("--sizes", help="prompt sizes in tokens, comma-separated (default: %(default)s)",
                    default=",".join(map(str, SIZES)))
    a = ap.parse_args()
    text = "".join(json.loads(line)["prefix"] for line in open(a.cases))
    port = free_port()
    cmd = [a.laya, "--device", a.device, "serve", "--small", a.model, "--large", "none", "--precision", "q8",
           "--http-addr", f"127.0.0.1:{port}"]
    if a.wrap:
        cmd = [a.wrap, "exec"] + cmd
    env = dict(os.environ, XDG_RUNTIME_DIR=tempfile.mkdtemp())
    t0 = time.perf_counter()
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                sys.exit(f"laya serve exited with {server.returncode}")
            try:
                h = get(base + "/health")
                models = h.get("models") or []
                failed = [m for m in models if m.get("state") == "failed"]
                if failed:
                    sys.exit(f"laya serve: {failed[0].get('id')} failed: {failed[0].get('error')}")
                if models and all(m.get("state") == "ready" and m.get("warm", True) for m in models):
                    break
            except OSError:
                pass
            time.sleep(0.2)
        ready_s = time.perf_counter() - t0
        print(f"ready after {ready_s:.1f} s", flush=True)
        rows = []
        at = 0
        for size in map(int, a.sizes.split(",")):
            times = []
            for _ in range(2):
                n = size * 3  # bytes; about 3 a token in code
                prefix = text[at:at + n]
                at += n
                ms, out = timed_post(base, {"prefix": prefix, "suffix": "\n", "max_tokens": a.max_tokens,
                                                     "max_prompt_tokens": 4096, "temperature": 0})
                times.append((ms, out.get("timing", {})))
            (first, t1), (second, _) = times
            row = {"size_tokens": size, "prompt_tokens": t1.get("prompt_tokens"), "first_ms": round(first, 1),
                   "second_ms": round(second, 1), "stall_ms": round(first - second, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        worst = max(r["stall_ms"] for r in rows)
        summary = {"model": os.path.basename(a.model), "ready_s": round(ready_s, 1), "rows": rows,
                   "worst_stall_ms": worst}
        print(f"worst stall of a new prompt size: {worst:.0f} ms", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(summary, f, indent=1)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
