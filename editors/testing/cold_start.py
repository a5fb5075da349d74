#!/usr/bin/env python3
"""An editor's first request on a cold daemon, at the protocol level (standard library only).

    cold_start.py [--init-options JSON] [--progress] [--snippets] -- COMMAND...

Runs COMMAND (an editor integration's `laya lsp` command line) with LAYA_RUNTIME_DIR set to a
new directory, so no daemon runs there and `laya lsp` starts one, which loads its model. Then,
as the editor would: `initialize` (offering `$/progress` with `--progress`, snippet items with
`--snippets`), `initialized`, a Python file opened with `def add(a, b):` and an indented line,
and right away the first request, `textDocument/completion` (what Helix and Zed's popup ask),
which must be answered with a non-empty suggestion once the model has loaded; then
`textDocument/inlineCompletion` at the same place. Prints the answers and the server's
messages; exits non-zero on any failure. The daemon it started is stopped at the end.
"""

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lsp_smoke import Client  # noqa: E402


def suggestion(answer):
    """The first item's text in a completion or inline completion answer, or ''."""
    result = answer.get("result")
    items = result.get("items", []) if isinstance(result, dict) else result or []
    if not items:
        return ""
    first = items[0]
    edit = first.get("textEdit") or {}
    text = edit.get("newText") or first.get("insertText") or ""
    return text if isinstance(text, str) else text.get("value", "")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init-options", default="{}")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--snippets", action="store_true")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("command", nargs="+")
    a = p.parse_args()
    runtime = tempfile.mkdtemp(prefix="laya-cold-")
    os.chmod(runtime, 0o700)
    os.environ["LAYA_RUNTIME_DIR"] = runtime
    ok = True
    c = Client(a.command)
    try:
        capabilities = {
            "window": {"workDoneProgress": a.progress},
            "textDocument": {"completion": {"completionItem": {"snippetSupport": a.snippets}}},
        }
        c.request("initialize", {"processId": os.getpid(), "rootUri": None, "capabilities": capabilities,
                                 "initializationOptions": json.loads(a.init_options)})
        c.notify("initialized", {})
        uri = "file:///tmp/laya-cold/add.py"
        c.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "python", "version": 1, "text": "def add(a, b):\n    "}})
        at = {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 4}, "context": {"triggerKind": 1}}
        for method in ["textDocument/completion", "textDocument/inlineCompletion"]:
            r = c.request(method, at, timeout=a.timeout)
            text = suggestion(r)
            print(method, json.dumps(r))
            if not text.strip():
                print(f"FAILED: {method} got no suggestion")
                ok = False
        if not os.path.exists(os.path.join(runtime, "laya.pid")):
            print(f"FAILED: laya lsp started no daemon in {runtime}")
            ok = False
        if a.progress:
            kinds = [n["params"]["value"]["kind"] for n in c.notes
                     if n.get("method") == "$/progress" and n["params"]["token"] == "laya/model"]
            print("model progress:", kinds)
            if kinds[:1] != ["begin"] or kinds[-1:] != ["end"]:
                print("FAILED: no $/progress begin and end for the model's load")
                ok = False
        c.request("shutdown", None)
        c.notify("exit", None)
        c.proc.wait(timeout=10)
    except Exception as e:  # a timeout, the server gone
        print(f"FAILED: {e!r}")
        ok = False
    finally:
        if c.proc.poll() is None:
            c.proc.kill()
        try:
            with open(os.path.join(runtime, "laya.pid")) as f:
                os.kill(int(f.read().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        shutil.rmtree(runtime, ignore_errors=True)
    for n in c.notes:
        print("server:", json.dumps(n)[:300])
    print("cold start: ok" if ok else "cold start: FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
