#!/usr/bin/env python3
"""A tiny deterministic OpenAI-compatible completions server for the editor tests.

`laya lsp --remote-url http://127.0.0.1:PORT/v1` sends `POST /v1/completions` with
`{"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stop"}`, where `prompt` is a
Qwen fill-in-the-middle string (`<|fim_prefix|>…<|fim_suffix|>…<|fim_middle|>`, possibly
preceded by `<|repo_name|>` / `<|file_sep|>` parts). This server answers from a fixed table:
the first rule whose `prefix_endswith` the text before the cursor ends with gives the
completion; no match gives an empty completion. Real servers' `stop` handling is imitated
(the text is cut before the first stop string).

Standard library only. Usage:

    stub_openai.py [--port 0] [--port-file FILE] [--log FILE.jsonl] [--rules FILE.json]

`--port 0` picks a free port; the port is written to `--port-file` once the server listens.
Each request is appended to `--log` as one JSON line (`path`, `body`, `prefix`, `suffix`,
`answer`). `GET /v1/models` lists one model, `stub`.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Built-in rules: the editor tests type these function headers and expect these bodies.
DEFAULT_RULES = [
    # The basic whole-line suggestion (VS Code, Neovim).
    {"prefix_endswith": "def add(a, b):\n    ", "completion": "return a + b\n"},
    # Characters that a snippet must escape (`$`, `{`, `}`, `\`): a client that passes the
    # text through as a snippet unescaped would turn `${x:.2f}` into a placeholder.
    {
        "prefix_endswith": "def price(x):\n    ",
        "completion": 'return f"${x:.2f}" + "\\\\"\n',
    },
]

FIM_PREFIX = "<|fim_prefix|>"
FIM_SUFFIX = "<|fim_suffix|>"
FIM_MIDDLE = "<|fim_middle|>"


def split_fim(prompt):
    """(prefix, suffix) of a Qwen FIM prompt; the whole prompt as prefix if it is not one.

    Text after `<|fim_middle|>` is the start of the middle, already written (laya continues its
    last prompt while the user types at its cursor): it belongs to the text before the cursor."""
    start = prompt.rfind(FIM_PREFIX)
    if start < 0:
        return prompt, ""
    rest = prompt[start + len(FIM_PREFIX) :]
    prefix, sep, rest = rest.partition(FIM_SUFFIX)
    if not sep:
        return prefix, ""
    suffix, _, middle = rest.partition(FIM_MIDDLE)
    return prefix + middle, suffix


def answer(rules, prefix):
    for rule in rules:
        if prefix.endswith(rule["prefix_endswith"]):
            return rule["completion"]
    return ""


def apply_stop(text, stop):
    if isinstance(stop, str):
        stop = [stop]
    cut = len(text)
    for s in stop or []:
        if s:
            i = text.find(s)
            if i >= 0:
                cut = min(cut, i)
    return text[:cut]


class Handler(BaseHTTPRequestHandler):
    server_version = "laya-stub-openai/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keep stderr quiet; requests go to --log
        pass

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.path.rstrip("/").endswith("/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(raw)
            prompt = body["prompt"]
            if isinstance(prompt, list):
                prompt = prompt[0]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            self._send(400, {"error": {"message": f"bad request: {e}"}})
            return
        prefix, suffix = split_fim(prompt)
        text = apply_stop(answer(self.server.rules, prefix), body.get("stop"))
        n = max(1, int(body.get("n") or 1))
        self.server.record(
            {"path": self.path, "body": body, "prefix": prefix, "suffix": suffix, "answer": text}
        )
        self._send(
            200,
            {
                "id": f"cmpl-stub-{self.server.count}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or "stub",
                "choices": [
                    {"index": i, "text": text, "finish_reason": "stop", "logprobs": None}
                    for i in range(n)
                ],
                "usage": {
                    "prompt_tokens": len(prompt) // 4,
                    "completion_tokens": len(text) // 4,
                    "total_tokens": (len(prompt) + len(text)) // 4,
                },
            },
        )


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, rules, log_path):
        super().__init__(addr, Handler)
        self.rules = rules
        self.log_path = log_path
        self.count = 0
        self.lock = threading.Lock()

    def record(self, entry):
        with self.lock:
            self.count += 1
            if self.log_path:
                with open(self.log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", help="write the listening port here")
    ap.add_argument("--log", help="append each request as a JSON line")
    ap.add_argument("--rules", help="JSON list of {prefix_endswith, completion}, tried first")
    args = ap.parse_args()
    rules = list(DEFAULT_RULES)
    if args.rules:
        with open(args.rules, encoding="utf-8") as f:
            rules = json.load(f) + rules
    server = StubServer((args.host, args.port), rules, args.log)
    port = server.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
    print(f"stub OpenAI server on http://{args.host}:{port}/v1", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
