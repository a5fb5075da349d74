#!/usr/bin/env python3
"""The llama.cpp side of `laya bench typing`: the same keystrokes through llama-cpp-python's
server on the same GGUF, one fill-in-the-middle request per keystroke, with the server's prompt
cache (llama-cpp-python keeps the KV of the previous prompt and reuses its longest common
prefix, as llama.cpp's /infill does with cache_prompt).

    laya bench typing --steps-out steps.json ...
    $(scripts/peer-setup.sh | tail -1) scripts/bench_typing_peer.py --model MODEL.gguf \\
        --steps steps.json [--max-tokens 16] [--budget 2048] [--threads 2] [--out FILE]

Each keystroke's prefix and suffix are cut to the same windows laya's prompt budget gives
(suffix 15 %, the rest prefix, 3 bytes a token, at line boundaries) and sent as the prompt
`<|fim_prefix|>…<|fim_suffix|>…<|fim_middle|>` (llama-cpp-python has no /infill; see
scripts/bench_infill.py). Greedy, no stop strings. Prints p50/p90/p99 of the per-keystroke wall
time and writes {"engine", "model", "traces": [{"id", "ms": [...]}]}.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_infill import fim_prompt, free_port, post, resolve_model, wait_ready  # noqa: E402


def tail_lines(s, max_bytes):
    b = s.encode("utf-8")
    if len(b) <= max_bytes:
        return s
    cut = b[len(b) - max_bytes:].decode("utf-8", errors="ignore")
    i = cut.find("\n")
    return cut[i + 1:] if 0 <= i < len(cut) - 1 else cut


def head_lines(s, max_bytes):
    b = s.encode("utf-8")
    if len(b) <= max_bytes:
        return s
    cut = b[:max_bytes].decode("utf-8", errors="ignore")
    i = cut.rfind("\n")
    return cut[:i + 1] if i > 0 else cut


def percentile(values, p):
    v = sorted(values)
    if not v:
        return 0.0
    rank = max(1, -(-len(v) * p // 100))
    return v[min(int(rank), len(v)) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", required=True, help="laya bench typing --steps-out FILE")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--out")
    args = ap.parse_args()
    import llama_cpp  # noqa: F401

    model = resolve_model(args.model)
    traces = json.loads(Path(args.steps).read_text())
    total = args.budget * 3
    suffix_max = int(total * 0.15)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--n_ctx", str(args.n_ctx),
           "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
           "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    out = {"engine": "llama.cpp", "model": model.name, "traces": []}
    sampling = {"max_tokens": args.max_tokens, "temperature": 0.0, "repeat_penalty": 1.0, "stream": False}
    try:
        wait_ready(base, proc, 600)
        post(base, "/v1/completions", {"prompt": fim_prompt("def add(a, b):\n    ", "\n"), **sampling})
        all_ms = []
        for t in traces:
            ms = []
            for i, step in enumerate(t["steps"]):
                suffix = head_lines(step["suffix"], suffix_max)
                prefix = tail_lines(step["prefix"], total - len(suffix.encode("utf-8")))
                start = time.perf_counter()
                post(base, "/v1/completions", {"prompt": fim_prompt(prefix, suffix), **sampling})
                ms.append((time.perf_counter() - start) * 1000)
                print(f"  {t['id']} {i + 1:>3} {ms[-1]:9.1f} ms", file=sys.stderr)
            out["traces"].append({"id": t["id"], "ms": [round(m, 1) for m in ms]})
            all_ms += ms
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"llama.cpp {model.name}: {len(all_ms)} keystrokes; latency p50 {percentile(all_ms, 50):.1f} ms, "
          f"p90 {percentile(all_ms, 90):.1f} ms, p99 {percentile(all_ms, 99):.1f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
