#!/usr/bin/env python3
"""Fit of each recorded branch to the lines after the cursor, scored by llama.cpp (CPU).

    PY=$(scripts/peer-setup.sh | tail -n 1)
    $PY bench/quality/fit_proxy.py GGUF CASES.jsonl LAYA-br4.json OUT.jsonl [LIMIT]
    python3 bench/quality/fit_proxy.py --analyze OUT.jsonl [OUT2.jsonl ...]

Measures, without a GPU, whether ranking branches by how well their first line fits the code
after the cursor beats greedy (docs/lab/2026-12-04-fit-lines-ranking.md: it did not). For
every case of a `firstTokenBranches` run (`laya bench quality`, which records each branch)
whose branches' first lines disagree on being the expected line (elsewhere no ranking can
change the score), evaluates
`<|fim_prefix|>` + the prefix once, then for each distinct first line c the summed
log-probability of c and of c followed by the next 1, 2 and 3 non-empty suffix lines
(cumulative), as plain left-to-right code. `--analyze` prints, per number of suffix lines K,
the cases a ranking by that score wins and loses against greedy (the branch of the most likely
first token), overall and per language. OUT.jsonl is appended to, so a run can resume.
"""
import json
import sys
import time
from collections import defaultdict

LANGUAGES = ["python", "rust", "typescript", "go", "c", "java"]


def first_line(s):
    return s.split("\n", 1)[0].rstrip()


def analyze(paths):
    rows = [json.loads(line) for p in paths for line in open(p, encoding="utf-8")]
    print(f"{len(rows)} cases whose branches disagree on the expected line")
    for k in range(4):
        for margin in (0.0, 2.0):
            won, lost = defaultdict(int), defaultdict(int)
            for r in rows:
                def at(c):  # the score with k suffix lines, or all there are
                    return c["lp"][min(k, len(c["lp"]) - 1)]
                greedy = min(r["cands"], key=lambda c: c["choice"])
                best = max(r["cands"], key=at)
                if at(best) - at(greedy) <= margin:
                    best = greedy
                g, b = greedy["line"] == r["expected"], best["line"] == r["expected"]
                lang = r["id"].split("/")[0]
                won[lang] += b and not g
                lost[lang] += g and not b
            per = " ".join(f"{lang} {won[lang] - lost[lang]:+d}" for lang in LANGUAGES)
            print(f"K={k} margin {margin}: won {sum(won.values())}, lost {sum(lost.values())}, "
                  f"net {sum(won.values()) - sum(lost.values()):+d}   {per}")


def score(model, cases_file, results_file, out_file, limit):
    import numpy as np
    from llama_cpp import Llama

    cases = {json.loads(line)["id"]: json.loads(line) for line in open(cases_file, encoding="utf-8") if line.strip()}
    results = json.load(open(results_file, encoding="utf-8"))["results"]
    llm = Llama(model_path=model, n_ctx=1024, n_batch=512, logits_all=True, n_threads=2, verbose=False)

    def tok(s, special=False):
        return llm.tokenize(s.encode(), add_bos=False, special=special)

    def logprobs(rows, toks):
        rows = rows.astype(np.float64)
        m = rows.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(rows - m).sum(axis=1))
        return rows[np.arange(len(toks)), toks] - lse

    try:
        done = {json.loads(line)["id"] for line in open(out_file, encoding="utf-8")}
    except FileNotFoundError:
        done = set()
    out = open(out_file, "a", encoding="utf-8")
    n = 0
    for r in results:
        c = cases[r["id"]]
        seen = {}
        for a in r.get("alternatives") or []:
            seen.setdefault(first_line(a["text"]), a["choice"])
        hits = [line == c["expected"] for line in seen]
        if not (any(hits) and not all(hits)) or r["id"] in done:
            continue
        if n >= limit:
            break
        n += 1
        t0 = time.time()
        pre = tok("<|fim_prefix|>", special=True) + tok(c["prefix"])
        if len(pre) > 900:
            pre = pre[:1] + pre[-899:]
        llm.reset()
        llm.eval(pre)
        # The newline(s) and text of each of the next 3 non-empty suffix lines.
        segs, pending = [], ""
        for line in c["suffix"].split("\n")[1:]:
            pending += "\n" + line
            if line.strip():
                segs.append(pending)
                pending = ""
                if len(segs) == 3:
                    break
        cands = []
        for line, choice in seen.items():
            parts = [tok(line)] + [tok(s) for s in segs]
            parts += [[]] * (4 - len(parts))
            toks = [t for p in parts for t in p]
            lps, ns, cum, k = [], [], 0.0, 0
            if toks:
                llm.n_tokens = len(pre)
                llm.eval(toks)
                lp = logprobs(llm.scores[len(pre) - 1: len(pre) - 1 + len(toks)], np.array(toks))
            for p in parts:
                cum += float(lp[k:k + len(p)].sum()) if p else 0.0
                k += len(p)
                lps.append(cum)
                ns.append(k)
            cands.append({"line": line, "choice": choice, "lp": lps, "n": ns})
        out.write(json.dumps({"id": r["id"], "expected": c["expected"], "cands": cands}) + "\n")
        out.flush()
        print(f"{n} {r['id']}: {len(pre)} tokens, {len(cands)} lines, {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--analyze":
        analyze(sys.argv[2:])
    elif len(sys.argv) in (5, 6):
        score(*sys.argv[1:5], int(sys.argv[5]) if len(sys.argv) == 6 else 10**9)
    else:
        sys.exit(__doc__)
