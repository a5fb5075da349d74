#!/usr/bin/env python3
"""The llama.cpp side of `laya bench typing`: the same keystrokes through llama.cpp on the same
GGUF, one fill-in-the-middle request per keystroke, with the server's prompt cache.

    laya bench typing --sequential --steps-out steps.json ...
    $(scripts/peer-setup.sh | tail -1) scripts/bench_typing_peer.py --model MODEL.gguf \\
        --steps steps.json [--max-tokens 16] [--budget 2048] [--suffix-share 0.02] [--threads 2] [--out FILE]
    python3 scripts/bench_typing_peer.py --server-bin build/bin/llama-server --model MODEL.gguf \\
        --steps steps.json [--server-arg=--cache-reuse --server-arg=256] ...

Two servers: by default llama-cpp-python's (CPU, `--threads`), which keeps the KV of the
previous prompt and reuses its longest common prefix; it has no /infill, so the prompt
`<|fim_prefix|>…<|fim_suffix|>…<|fim_middle|>` is sent to /v1/completions (see
scripts/bench_infill.py). With `--server-bin`, llama.cpp's own `llama-server` (e.g. a CUDA build
on the GPU machine, all layers offloaded) and its /infill endpoint with `cache_prompt`
(scripts/llama_server.py); `--server-arg` passes options through (repeatable).

With `--schedule` (steps written by the typist, `laya bench typing --steps-out` without
`--sequential`), each keystroke's request is sent at the time the typist typed it, as an
editor without a debounce sends them: a request still unanswered when the next keystroke comes
is abandoned (its connection closed, as an editor's client cancels), and only answers that came
before the next keystroke count as shown; the accept step's request is timed on its own.
Prints keystroke to answer p50/p90/p99 over the answers shown, the abandoned count, and accept
to answer. `--stop` ends an answer (laya's automatic requests end at the line break).

Each keystroke's prefix and suffix are cut to the windows laya's prompt budget gives (the
suffix `--suffix-share` of the budget, laya's default 0.02, the rest prefix, 3 bytes a token,
at line boundaries). Greedy, no stop strings. Prints p50/p90/p99 of the per-keystroke wall time
and writes {"engine", "model", "traces": [{"id", "ms": [...], "prefilled": [...]}]}
(`prefilled`: the prompt tokens the server evaluated, where it reports them).
"""

import argparse
import http.client
import json
import subprocess
import sys
import threading
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
    ap.add_argument("--suffix-share", type=float, default=0.02)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--server-bin", help="llama.cpp's llama-server binary (its /infill endpoint)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="an option for llama-server (repeatable), e.g. --server-arg=--cache-reuse")
    ap.add_argument("--server-log")
    ap.add_argument("--schedule", action="store_true",
                    help="send each keystroke at the typist's time (steps with at_ms), abandoning unanswered ones")
    ap.add_argument("--stop", action="append", default=[],
                    help="a stop string (repeatable; backslash escapes such as '\\n' are read)")
    ap.add_argument("--out")
    args = ap.parse_args()
    args.stop = [bytes(x, "utf-8").decode("unicode_escape") for x in args.stop]

    model = resolve_model(args.model)
    traces = json.loads(Path(args.steps).read_text())
    total = args.budget * 3
    suffix_max = int(total * args.suffix_share)
    if args.server_bin:
        from llama_server import LlamaServer

        server = LlamaServer(args.server_bin, model, free_port(), args.n_ctx, args.server_arg, args.server_log)
        engine = "llama.cpp llama-server /infill" + (f" ({' '.join(args.server_arg)})" if args.server_arg else "")
    else:
        server = PythonServer(model, args)
        engine = "llama.cpp (llama-cpp-python)"
    out = {"engine": engine, "model": model.name, "suffix_share": args.suffix_share, "traces": []}
    all_ms = []
    if args.schedule:
        if not args.server_bin:
            sys.exit("bench_typing_peer: --schedule needs --server-bin (llama-server's /infill)")
        with server:
            server.infill("def add(a, b):\n    ", "\n", args.max_tokens)  # warm-up, untimed
            out["version"] = server.version()
            return scheduled(server, traces, args, total, suffix_max, engine, model, out)
    with server:
        server.infill("def add(a, b):\n    ", "\n", args.max_tokens)  # warm-up, untimed
        out["version"] = server.version()
        for t in traces:
            ms, prefilled = [], []
            for i, step in enumerate(t["steps"]):
                suffix = head_lines(step["suffix"], suffix_max)
                prefix = tail_lines(step["prefix"], total - len(suffix.encode("utf-8")))
                start = time.perf_counter()
                _, resp = server.infill(prefix, suffix, args.max_tokens)
                ms.append((time.perf_counter() - start) * 1000)
                prefilled.append((resp.get("timings") or {}).get("prompt_n"))
                print(f"  {t['id']} {i + 1:>3} {ms[-1]:9.1f} ms prefilled {prefilled[-1]}", file=sys.stderr)
            out["traces"].append({"id": t["id"], "ms": [round(m, 1) for m in ms], "prefilled": prefilled})
            all_ms += ms
    print(f"{engine} {model.name}: {len(all_ms)} keystrokes; latency p50 {percentile(all_ms, 50):.1f} ms, "
          f"p90 {percentile(all_ms, 90):.1f} ms, p99 {percentile(all_ms, 99):.1f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


class Request(threading.Thread):
    """One /infill request on its own connection; `abandon` closes it (an editor's cancel)."""

    def __init__(self, base, body):
        super().__init__(daemon=True)
        host, port = base.replace("http://", "").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=900)
        self.body = json.dumps(body).encode("utf-8")
        self.sent = time.perf_counter()
        self.ms, self.content, self.error = None, None, None

    def run(self):
        try:
            self.conn.request("POST", "/infill", self.body, {"Content-Type": "application/json"})
            resp = json.loads(self.conn.getresponse().read().decode("utf-8"))
            self.ms = (time.perf_counter() - self.sent) * 1000
            self.content = resp.get("content", "")
        except (OSError, ValueError, http.client.HTTPException) as e:
            self.error = str(e)

    def abandon(self):
        try:
            self.conn.sock and self.conn.sock.shutdown(2)
        except OSError:
            pass


def scheduled(server, traces, args, total, suffix_max, engine, model, out):
    shown, accepts, abandoned, keystrokes = [], [], 0, 0
    for t in traces:
        start = time.perf_counter()
        prev, rows = None, []
        for step in t["steps"]:
            suffix = head_lines(step["suffix"], suffix_max)
            prefix = tail_lines(step["prefix"], total - len(suffix.encode("utf-8")))
            delay = start + step["at_ms"] / 1000 - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if prev is not None:
                if prev.ms is None:
                    prev.abandon()
                    abandoned += 1
                    rows.append(None)
                else:
                    rows.append(prev.ms)
                    shown.append(prev.ms)
            body = {"input_prefix": prefix, "input_suffix": suffix, "input_extra": [],
                    "n_predict": args.max_tokens, "cache_prompt": True, "temperature": 0.0,
                    "top_k": 1, "repeat_penalty": 1.0, "stream": False}
            if args.stop:
                body["stop"] = args.stop
            prev = Request(server.base, body)
            prev.start()
            if step.get("accept"):
                prev.join()
                accepts.append(prev.ms or 0.0)
                prev = None
            else:
                keystrokes += 1
        if prev is not None:
            prev.join()
            rows.append(prev.ms)
            if prev.ms is not None:
                shown.append(prev.ms)
        out["traces"].append({"id": t["id"], "ms": [None if m is None else round(m, 1) for m in rows]})
        print(f"  {t['id']}: {len(rows)} keystrokes, {sum(m is None for m in rows)} abandoned", file=sys.stderr)
    out["summary"] = {"keystrokes": keystrokes, "shown": len(shown), "abandoned": abandoned,
                      "p50_ms": percentile(shown, 50), "p90_ms": percentile(shown, 90),
                      "p99_ms": percentile(shown, 99), "accepts": len(accepts),
                      "accept_p50_ms": percentile(accepts, 50), "accept_p99_ms": percentile(accepts, 99)}
    sm = out["summary"]
    print(f"{engine} {model.name} (typist's schedule): {keystrokes} keystrokes, answered before the next at "
          f"{sm['shown']}, abandoned {abandoned}; keystroke to answer p50 {sm['p50_ms']:.1f} ms, "
          f"p90 {sm['p90_ms']:.1f} ms, p99 {sm['p99_ms']:.1f} ms; accept to answer ({len(accepts)}) "
          f"p50 {sm['accept_p50_ms']:.1f} ms, p99 {sm['accept_p99_ms']:.1f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


class PythonServer:
    """llama-cpp-python's server (CPU) with a client-built FIM prompt on /v1/completions."""

    def __init__(self, model, args):
        self.model, self.args = model, args

    def __enter__(self):
        import llama_cpp  # noqa: F401

        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        a = self.args
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--n_ctx", str(a.n_ctx),
               "--n_threads", str(a.threads), "--n_threads_batch", str(a.threads),
               "--host", "127.0.0.1", "--port", str(port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_ready(self.base, self.proc, 600)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def version(self):
        import llama_cpp

        return f"llama-cpp-python {llama_cpp.__version__}"

    def infill(self, prefix, suffix, n_predict):
        body = {"prompt": fim_prompt(prefix, suffix), "max_tokens": n_predict, "temperature": 0.0,
                "repeat_penalty": 1.0, "stream": False}
        r = post(self.base, "/v1/completions", body)
        return r["choices"][0]["text"], {}


if __name__ == "__main__":
    main()
