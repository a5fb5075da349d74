#!/usr/bin/env python3
"""The llama.cpp side of `laya bench quality`: the masked-line cases through llama-cpp-python's
server on the same GGUF, greedy, and the raw completions as JSON.

    $(scripts/peer-setup.sh | tail -1) scripts/bench_infill.py --model MODEL.gguf \
        [--cases bench/quality/cases.jsonl] [--out FILE] [--limit N] [--language L] \
        [--threads 2] [--n-ctx 4096] [--max-tokens 48] [--server-log FILE] \
        [--budget TOKENS] [--workspace-dir DIR]
    $(scripts/peer-setup.sh | tail -1) scripts/bench_infill.py --model MODEL.gguf --check-prompt
    python3 scripts/bench_infill.py --server-bin build/bin/llama-server --model MODEL.gguf [...]

With --server-bin the cases go to llama.cpp's own C++ server and its /infill endpoint instead
(scripts/llama_server.py: e.g. a CUDA build on the GPU machine, all layers offloaded; the
prompt is /infill's, with its repository-level header); the rest of this text is about the
default, llama-cpp-python's server.

--model takes a path or a file name in the model directory (~/.cache/laya/models).

It starts `python -m llama_cpp.server` on a free loopback port, waits until it answers, sends
every case (in file order, after one untimed warm-up request) and stops the server. Output:

    {"engine": "llama.cpp", "version": ..., "model": ..., "endpoint": ..., "results":
     [{"id": ..., "output": <raw completion text>, "ms": <request wall time>,
       "prompt_tokens": ..., "completion_tokens": ..., "finish_reason": ...}, ...]}

Endpoint. llama.cpp's C++ server has /infill; llama-cpp-python's server does not (its routes are
/v1/completions, /v1/chat/completions, /v1/embeddings, /v1/models and /extras/*). Its
/v1/completions takes a `suffix` field, but in 0.3.36 `Llama._create_completion` hard-codes the
FIM token ids to 0 (`prefix_token_id: int = 0  # self._model.token_prefix() # TODO: Fix`), so for
Qwen2.5-Coder that route builds `!prefix!suffix!` (id 0 is "!") and also drops the suffix's first
token; `--check-prompt` shows both layouts. So this script builds the FIM prompt itself,

    <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>

and sends it as `prompt` with no `suffix`: then llama-cpp-python tokenizes the prompt with
special=True, so each marker becomes one special token (151659, 151661, 151660 for Qwen2.5-Coder).
This is the layout of llama.cpp's /infill without its repository-level extras
(`<|repo_name|>`, `<|file_sep|>` chunks), which it adds only when given extra context. Every
request is checked: the server's reported prompt_tokens must equal the length of
/extras/tokenize's tokens for the same text (special=True), which contain each FIM id once.

Sampling: max_tokens (48) and greedy (temperature 0, repeat_penalty 1.0), no stop strings;
generation ends at the first end-of-generation token (llama_vocab_is_eog) or at max_tokens.
llama.cpp's threading defaults are kept. On a CPU shared with other work its OpenMP threads spin
at every barrier (see scripts/bench_llama_cpp.py): there OMP_WAIT_POLICY=PASSIVE in the
environment (passed on to the server, recorded as omp_wait_policy) makes a run several times
faster and leaves the greedy outputs unchanged; only `ms` depends on it.

--budget N cuts each case to llama.cpp /infill's shares of an N-token batch before it builds the
prompt: the prefix keeps its last whole lines that fit in 3*(N/4) tokens, the suffix its first
whole lines that fit in N/4 - 2 tokens (a line longer than its share goes whole or not at
all; the masked line's indentation at the end of the prefix always stays). Without it the
whole prefix and suffix go (the 1200/400-byte sets fit any context; with --server-bin llama-server
cuts by its own --batch-size); the file-window sets
(12000/3000 bytes) need it, e.g. --budget 2048, or they overflow --n-ctx.

--workspace-dir is accepted and ignored: plain FIM sees only the file, so a cross-file case set
(cases-repo*.jsonl, whose workspaces laya reads) runs as it is, and the option only records, in
the output, that the workspace was not used.

With --out the file is rewritten after every case ("complete": false until the end), so a long
run can be watched and a killed one keeps what it had.
"""

import argparse
import codecs
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
ENDPOINT = "/v1/completions (client-built FIM prompt; llama-cpp-python has no /infill)"
ROOT = Path(__file__).resolve().parent.parent


def fim_prompt(prefix, suffix):
    return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}"


def resolve_model(name):
    p = Path(name)
    if p.is_file():
        return p.resolve()
    cache = Path(os.environ.get("LAYA_CACHE_DIR") or
                 Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "laya")
    q = cache / "models" / name
    if q.is_file():
        return q
    sys.exit(f"bench_infill: no model file {name} (nor {q})")


def load_cases(path, language, limit):
    cases = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
             if line.strip()]
    if language:
        cases = [c for c in cases if c["language"] == language]
    if limit is not None:
        cases = cases[:limit]
    for c in cases:
        for marker in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, "<|endoftext|>"):
            if marker in c["prefix"] or marker in c["suffix"]:
                sys.exit(f"bench_infill: case {c['id']} contains {marker}")
    return cases


def check_prompt(model, case):
    """Shows the token layout llama-cpp-python builds, through the completion code path itself
    (Llama.generate is replaced by a hook that records the prompt tokens and stops)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(model), vocab_only=True, verbose=False)
    ids = {"fim_prefix": llm._model.token_prefix(), "fim_suffix": llm._model.token_suffix(),
           "fim_middle": llm._model.token_middle()}
    print(f"GGUF FIM token ids: {ids}; id 0 = {llm.detokenize([0], special=True)!r}")
    captured = {}

    class Captured(Exception):
        pass

    def hook(self, tokens, **kwargs):
        captured["tokens"] = list(tokens)
        raise Captured

    Llama.generate = hook

    def layout(**kw):
        try:
            for _ in llm.create_completion(max_tokens=1, stream=True, **kw):
                pass
        except Captured:
            pass
        toks = captured.pop("tokens")
        text = llm.detokenize(toks, special=True).decode("utf-8", "replace")
        return toks, text

    prefix, suffix = case["prefix"], case["suffix"]
    toks, text = layout(prompt=fim_prompt(prefix, suffix))
    ok = (toks[0] == ids["fim_prefix"] and toks[-1] == ids["fim_middle"]
          and toks.count(ids["fim_suffix"]) == 1
          and text == fim_prompt(prefix, suffix))
    print(f"\n[used] prompt=FIM string, no suffix field: {len(toks)} tokens, "
          f"first {toks[:4]} last {toks[-3:]}; round-trips to the FIM string: {ok}")
    print(repr(text[:120]) + " ... " + repr(text[-160:]))
    toks2, text2 = layout(prompt=prefix, suffix=suffix)
    print(f"\n[not used] prompt=prefix, suffix=suffix: {len(toks2)} tokens, first {toks2[:4]} "
          f"last {toks2[-3:]}; FIM ids present: "
          f"{[t for t in toks2 if t in ids.values()]}")
    print(repr(text2[:120]) + " ... " + repr(text2[-160:]))
    return 0 if ok else 1


def count_tokens(base, text):
    if not text:
        return 0
    return len(post(base, "/extras/tokenize", {"input": text})["tokens"])


def cut_to_budget(base, prefix, suffix, budget):
    """The prefix's last whole lines within 3*(budget/4) tokens (plus the masked line's
    indentation, which follows the last newline) and the suffix's first whole lines within
    budget/4 - 2 tokens: llama.cpp /infill's shares of its batch, cut at line boundaries."""
    head, sep, indent = prefix.rpartition("\n")
    plines = (head + sep).splitlines(keepends=True)
    keep_p = 3 * (budget // 4)
    lo, hi = 0, len(plines)  # smallest start index whose tail fits
    while lo < hi:
        mid = (lo + hi) // 2
        if count_tokens(base, "".join(plines[mid:]) + indent) <= keep_p:
            hi = mid
        else:
            lo = mid + 1
    prefix = "".join(plines[lo:]) + indent
    slines = suffix.splitlines(keepends=True)
    keep_s = max(0, budget // 4 - 2)
    lo, hi = 0, len(slines)  # largest count of leading lines that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(base, "".join(slines[:mid])) <= keep_s:
            lo = mid
        else:
            hi = mid - 1
    return prefix, "".join(slines[:lo])


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base, path, body, timeout=900):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode("utf-8"),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode("utf-8"))


def wait_ready(base, proc, timeout_s):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            sys.exit(f"bench_infill: the server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, socket.timeout):
            pass
        time.sleep(0.5)
    sys.exit(f"bench_infill: the server was not ready after {timeout_s} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--cases", default=str(ROOT / "bench" / "quality" / "cases.jsonl"))
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--language")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=4096,
                    help="llama-server's batch: /infill keeps the prefix's last 3/4 of it and fills the rest with suffix")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--stop", action="append", default=[],
                    help="a stop string for llama-server's /infill (repeatable; backslash escapes such as "
                         "'\\n' are read): the same end as laya's line answers, for a like-for-like latency")
    ap.add_argument("--server-log", help="the server's stdout/stderr (default: discarded)")
    ap.add_argument("--budget", type=int,
                    help="cut prefix and suffix to /infill's shares of this many tokens "
                         "(whole lines; default: no cut)")
    ap.add_argument("--workspace-dir",
                    help="ignored (plain FIM reads no workspace); recorded in the output")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--server-bin", help="llama.cpp's llama-server binary: use its /infill")
    ap.add_argument("--server-arg", action="append", default=[], help="an option for llama-server (repeatable)")
    ap.add_argument("--check-prompt", action="store_true",
                    help="print the prompt tokens llama-cpp-python builds for the first case, "
                         "both ways, and exit (needs no server)")
    args = ap.parse_args()
    if args.server_bin:
        return native(args)

    try:
        import llama_cpp
        import llama_cpp.server  # noqa: F401  (the [server] extras)
    except ImportError as e:
        sys.exit(f"bench_infill: cannot import llama_cpp / llama_cpp.server ({e}); run "
                 "scripts/peer-setup.sh and use the python it prints")

    model = resolve_model(args.model)
    cases = load_cases(args.cases, args.language, args.limit)
    if not cases:
        sys.exit("bench_infill: no cases selected")
    if args.check_prompt:
        sys.exit(check_prompt(model, cases[0]))

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
           "--n_ctx", str(args.n_ctx), "--n_threads", str(args.threads),
           "--n_threads_batch", str(args.threads), "--host", "127.0.0.1", "--port", str(port)]
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    results = []
    try:
        ready_s = wait_ready(base, proc, args.ready_timeout)
        print(f"bench_infill: server ready on {base} after {ready_s:.1f} s "
              f"({model.name}, {len(cases)} cases)", file=sys.stderr)
        sampling = {"max_tokens": args.max_tokens, "temperature": 0.0, "repeat_penalty": 1.0,
                    "stream": False}
        post(base, "/v1/completions", {"prompt": fim_prompt("def add(a, b):\n    ", "\n"),
                                        **sampling})  # warm-up, untimed
        fim_ids = {}
        for marker in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE):
            ids = post(base, "/extras/tokenize", {"input": marker})["tokens"]
            if len(ids) != 1:
                sys.exit(f"bench_infill: {marker} is not one special token in this GGUF: {ids}")
            fim_ids[marker] = ids[0]
        pre, suf, mid = fim_ids[FIM_PREFIX], fim_ids[FIM_SUFFIX], fim_ids[FIM_MIDDLE]
        t_all = time.monotonic()
        for n, case in enumerate(cases, 1):
            prefix, suffix = case["prefix"], case["suffix"]
            if args.budget:
                prefix, suffix = cut_to_budget(base, prefix, suffix, args.budget)
            prompt = fim_prompt(prefix, suffix)
            toks = post(base, "/extras/tokenize", {"input": prompt})["tokens"]
            if toks[0] != pre or toks[-1] != mid or toks.count(suf) != 1:
                sys.exit(f"bench_infill: {case['id']}: unexpected FIM layout {toks[:2]}..{toks[-2:]}")
            t = time.perf_counter()
            r = post(base, "/v1/completions", {"prompt": prompt, **sampling})
            ms = (time.perf_counter() - t) * 1000
            choice = r["choices"][0]
            usage = r.get("usage") or {}
            if usage.get("prompt_tokens") != len(toks):
                sys.exit(f"bench_infill: {case['id']}: the server's prompt has "
                         f"{usage.get('prompt_tokens')} tokens, the FIM tokenization {len(toks)}")
            results.append({"id": case["id"], "output": choice["text"], "ms": round(ms, 1),
                            "prompt_tokens": usage.get("prompt_tokens"),
                            "completion_tokens": usage.get("completion_tokens"),
                            "finish_reason": choice.get("finish_reason")})
            if args.out:
                write(args.out, document(args, model, fim_ids, results, done=False))
            print(f"bench_infill: [{n}/{len(cases)}] {case['id']} {ms / 1000:.1f} s "
                  f"{usage.get('prompt_tokens')}+{usage.get('completion_tokens')} tokens "
                  f"(elapsed {time.monotonic() - t_all:.0f} s)", file=sys.stderr)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log is not subprocess.DEVNULL:
            log.close()

    text = document(args, model, fim_ids, results, done=True)
    if args.out:
        write(args.out, text)
    else:
        sys.stdout.write(text)


def native(args):
    """The cases through llama-server's /infill (greedy, cache_prompt on)."""
    from llama_server import LlamaServer

    model = resolve_model(args.model)
    cases = load_cases(args.cases, args.language, args.limit)
    if not cases:
        sys.exit("bench_infill: no cases selected")
    results = []
    with LlamaServer(args.server_bin, model, free_port(), args.n_ctx, args.server_arg, args.server_log,
                     batch=args.batch_size) as srv:
        version = srv.version()
        stops = [codecs.decode(x, "unicode_escape") for x in args.stop]
        srv.infill("def add(a, b):\n    ", "\n", args.max_tokens)  # warm-up, untimed
        for n, case in enumerate(cases, 1):
            t = time.perf_counter()
            text, r = srv.infill(case["prefix"], case["suffix"], args.max_tokens, stops)
            ms = (time.perf_counter() - t) * 1000
            results.append({"id": case["id"], "output": text, "ms": round(ms, 1),
                            "prompt_tokens": r.get("tokens_evaluated"),
                            "completion_tokens": r.get("tokens_predicted"),
                            "finish_reason": r.get("stop_type")})
            print(f"bench_infill: [{n}/{len(cases)}] {case['id']} {ms:.0f} ms", file=sys.stderr)
    text = document(args, model, None, results, done=True, version=version,
                    endpoint="/infill (llama.cpp llama-server, cache_prompt)")
    if args.out:
        write(args.out, text)
    else:
        sys.stdout.write(text)


def document(args, model, fim_ids, results, done, version=None, endpoint=ENDPOINT):
    if version is None:
        import llama_cpp

        version = llama_cpp.__version__
    doc = {"engine": "llama.cpp", "version": version, "model": model.name,
           "endpoint": endpoint,
           "prompt_format": f"{FIM_PREFIX}{{prefix}}{FIM_SUFFIX}{{suffix}}{FIM_MIDDLE}",
           "fim_token_ids": fim_ids,
           "sampling": {"max_tokens": args.max_tokens, "temperature": 0.0,
                        "repeat_penalty": 1.0,
                        "stop": [codecs.decode(x, "unicode_escape") for x in args.stop] or None},
           "threads": args.threads, "n_ctx": args.n_ctx,
           "n_batch": args.batch_size if args.server_bin else None,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
           "budget": args.budget, "workspace_dir": args.workspace_dir,
           "cases": os.path.relpath(args.cases, ROOT), "complete": done, "results": results}
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def write(path, text):
    """Rewrites `path` atomically (the file holds the results so far during a run)."""
    tmp = f"{path}.tmp"
    Path(tmp).write_text(text, encoding="utf-8")
    os.replace(tmp, path)

if __name__ == "__main__":
    main()
