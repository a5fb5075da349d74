#!/usr/bin/env python3
"""Drives `laya lsp --remote-url STUB` over stdio like an editor would and prints what it answers.

A quick check of the server side the editor tests rely on (standard library only):

    lsp_smoke.py LAYA_BIN STUB_URL [--snippets]

Opens `add.py` with `def add(a, b):\\n    `, asks for `textDocument/inlineCompletion` and
`textDocument/completion` at the end, prints both answers as JSON, and exits non-zero when
either lacks `return a + b`. `--snippets` offers snippet support in the completion capability
(as Neovim does).
"""

import json
import subprocess
import sys
import threading
import time


class Client:
    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.next_id = 0
        self.results = {}
        self.cond = threading.Condition()
        self.notes = []
        threading.Thread(target=self._read, daemon=True).start()

    def _send(self, msg):
        data = json.dumps(msg).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(data) + data)
        self.proc.stdin.flush()

    def _read(self):
        f = self.proc.stdout
        while True:
            length = None
            while True:
                line = f.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            msg = json.loads(f.read(length))
            if "id" in msg and "method" in msg:  # a request from the server
                self._send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
                self.notes.append(msg)
            elif "id" in msg:
                with self.cond:
                    self.results[msg["id"]] = msg
                    self.cond.notify_all()
            else:
                self.notes.append(msg)

    def request(self, method, params, timeout=30):
        self.next_id += 1
        rid = self.next_id
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        deadline = time.time() + timeout
        with self.cond:
            while rid not in self.results:
                left = deadline - time.time()
                if left <= 0:
                    raise TimeoutError(method)
                self.cond.wait(left)
            return self.results.pop(rid)

    def notify(self, method, params):
        self._send({"jsonrpc": "2.0", "method": method, "params": params})


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    laya, url = sys.argv[1], sys.argv[2]
    snippets = "--snippets" in sys.argv
    c = Client([laya, "lsp", "--remote-url", url])
    init = c.request(
        "initialize",
        {
            "processId": None,
            "rootUri": "file:///tmp/laya-smoke",
            "capabilities": {
                "textDocument": {"completion": {"completionItem": {"snippetSupport": snippets}}}
            },
            "initializationOptions": {"completion": {"debounceMs": 0}},
        },
    )
    print(json.dumps(init.get("result", init).get("capabilities", init), indent=1))
    c.notify("initialized", {})
    uri = "file:///tmp/laya-smoke/add.py"
    text = "def add(a, b):\n    "
    c.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
    )
    pos = {"line": 1, "character": 4}
    ok = True
    for method, extra in [
        ("textDocument/inlineCompletion", {"context": {"triggerKind": 1}}),
        ("textDocument/completion", {"context": {"triggerKind": 1}}),
    ]:
        # The first request after `initialized` is answered (it waits for the engine).
        r = c.request(method, {"textDocument": {"uri": uri}, "position": pos, **extra})
        print(method, json.dumps(r, indent=1))
        ok &= "return a + b" in json.dumps(r)
    c.request("shutdown", None)
    c.notify("exit", None)
    c.proc.wait(timeout=10)
    for n in c.notes:
        print("server:", json.dumps(n))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
