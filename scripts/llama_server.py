"""llama.cpp's own C++ server (`llama-server`) as a peer: start it on a free loopback port,
send fill-in-the-middle requests to its /infill endpoint, stop it.

Used by bench_infill.py and bench_typing_peer.py with `--server-bin PATH` (a llama-server
binary, e.g. one built with CUDA for a GPU run; see docs/benchmarks.md). /infill builds the
prompt itself: for Qwen2.5-Coder it is

    <|repo_name|>myproject\\n<|file_sep|>filename\\n<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>

(the repository-level form, which llama.cpp uses whenever the vocabulary has those tokens), with
the prefix cut to its last 3/4 of a batch of tokens and the suffix to the rest; the batch is
4096 here by default so that the windows the callers cut (2048 tokens at most) pass whole;
callers that hand it whole files set it (llama-server's own default is 2048, the same prompt
size as laya's default budget).
`cache_prompt` is on: the server keeps the previous request's KV and reuses its longest common
token prefix. `--cache-reuse N` (passed through `extra_args`) additionally shifts cached chunks
of at least N tokens into place, as llama.cpp's editor plugins configure it.

Run as a script it checks a llama-server binary: `python3 scripts/llama_server.py --check BIN
MODEL.gguf` starts it on the GGUF, asks /completion for one token and exits 0 only when a
token came back (scripts/gpu/gpu-real-bench.sh runs it on the binary it carries or builds).
"""

import argparse
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request

from bench_infill import wait_ready


class LlamaServer:
    def __init__(self, binary, model, port, n_ctx=8192, extra_args=(), log=None, batch=4096):
        self.base = f"http://127.0.0.1:{port}"
        self.cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                    "-c", str(n_ctx), "-b", str(batch), "-ngl", "999", "-np", "1", *extra_args]
        self.log = open(log, "w") if log else subprocess.DEVNULL
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.base, self.proc, 600)  # llama-server answers /v1/models once loaded
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.log is not subprocess.DEVNULL:
            self.log.close()

    def version(self):
        try:
            with urllib.request.urlopen(self.base + "/props", timeout=10) as r:
                props = json.loads(r.read().decode("utf-8"))
            return props.get("build_info") or "llama-server"
        except (urllib.error.URLError, ValueError):
            return "llama-server"

    def infill(self, prefix, suffix, n_predict, stop=None):
        """Greedy /infill, ending at any of `stop` (strings); returns (text, the server's response)."""
        body = {"input_prefix": prefix, "input_suffix": suffix, "input_extra": [],
                "n_predict": n_predict, "cache_prompt": True, "temperature": 0.0,
                "top_k": 1, "repeat_penalty": 1.0, "stream": False}
        if stop:
            body["stop"] = list(stop)
        req = urllib.request.Request(self.base + "/infill", data=json.dumps(body).encode("utf-8"),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=900) as r:
            resp = json.loads(r.read().decode("utf-8"))
        return resp.get("content", ""), resp


def check(binary, model):
    """Start `binary` on `model` and complete one token; raises SystemExit with the reason."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with LlamaServer(binary, model, port, n_ctx=512, batch=512) as server:
        body = {"prompt": "def fibonacci(n):", "n_predict": 1, "temperature": 0.0}
        req = urllib.request.Request(server.base + "/completion", data=json.dumps(body).encode("utf-8"),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                resp = json.loads(r.read().decode("utf-8"))
        except (urllib.error.URLError, ConnectionError, socket.timeout, ValueError) as e:
            code = server.proc.poll()
            sys.exit(f"llama_server --check: no completion ({e}); the server "
                     + (f"exited with {code}" if code is not None else "is still running"))
        n = resp.get("tokens_predicted", resp.get("timings", {}).get("predicted_n"))
        if n != 1:
            sys.exit(f"llama_server --check: asked for one token, got {n}: {resp}")
        print(f"llama_server --check: {server.version()} completed one token: {resp.get('content')!r}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="check a llama-server binary with a one-token completion")
    ap.add_argument("--check", nargs=2, metavar=("BIN", "MODEL"), required=True)
    args = ap.parse_args()
    check(*args.check)
