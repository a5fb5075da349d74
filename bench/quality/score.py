#!/usr/bin/env python3
"""Scores a results file of the masked-line benchmark against bench/quality/cases.jsonl.

    python3 bench/quality/score.py RESULTS.json [RESULTS.json ...] [--cases FILE]... [--json]

RESULTS.json is {"results": [{"id": ..., "output": <raw completion>, ...}, ...]} (what
scripts/bench_infill.py writes). Per case, with `line` = the completion's first line (up to the
first "\\n") with trailing whitespace trimmed:
  exact-line       line == expected
  edit similarity  1 - levenshtein(line, expected) / max(len(line), len(expected)), in
                   characters (Unicode code points); 1.0 when both are empty
Prints per language: cases scored, exact-line rate and mean edit similarity, then all cases.
Cases missing from the results file are counted as not scored (listed under `missing`).

Several case files (`--cases` repeated) are scored as one set (their ids are distinct); a RESULTS argument may join
one engine's files with "+" (`laya-large.json+laya-xl.json`), so the two 600-case sets score as
1200 cases.

--versus compares the first RESULTS with each of the others case by case: per language the
exact lines of both, their ratio, the cases only one of them gets right, and for all cases the
two-sided sign test on those (the chance of a split at least as uneven if each such case were a
coin toss).

--bootstrap N (with --versus) asks how much a per-language ratio can be trusted: it draws N sets
of the same size from the cases, with replacement within each language (paired: a drawn case
brings both engines' answers), and prints per language the middle 90 % of the exact-line ratios
it saw and how often the ratio reached --goal (default 1.05), and how often every language
reached it at once. Seeded, so it prints the same numbers each time.

--rank picks each answer again from the alternatives laya records when its first token branches
(`firstTokenBranches`): `greedy` (the answer that began with the most likely token), `mean`
(best mean log-probability per token, what laya shows first), `sum` (best summed
log-probability), `any` (a diagnostic upper bound, not a ranking: an alternative whose first
line is the expected one, when there is one). Answers without alternatives stay as they are.

--strip-leading is a diagnostic, not the metric: it also trims the line's leading whitespace
(completions that repeat the indentation the prefix already ends with).
"""

import argparse
import json
import math
import random
import sys
from pathlib import Path

LANGUAGES = ["python", "rust", "typescript", "go", "c", "java"]


def first_line(output, strip_leading=False):
    line = output.split("\n", 1)[0].rstrip()
    return line.lstrip() if strip_leading else line


def levenshtein(a, b):
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def edit_similarity(line, expected):
    m = max(len(line), len(expected))
    return 1.0 if m == 0 else 1.0 - levenshtein(line, expected) / m


def score(cases, results, strip_leading=False):
    by_id = {r["id"]: r for r in results}
    rows = {}
    for c in cases:
        r = by_id.get(c["id"])
        if r is None:
            continue
        line = first_line(r["output"], strip_leading)
        rows.setdefault(c["language"], []).append(
            (line == c["expected"], edit_similarity(line, c["expected"])))
    table = {}
    order = [lang for lang in LANGUAGES if lang in rows] + sorted(set(rows) - set(LANGUAGES))
    for lang in order + ["all"]:
        rs = [x for v in rows.values() for x in v] if lang == "all" else rows[lang]
        if not rs:
            continue
        table[lang] = {"n": len(rs), "exact_line": sum(e for e, _ in rs) / len(rs),
                       "edit_similarity": sum(s for _, s in rs) / len(rs)}
    missing = [c["id"] for c in cases if c["id"] not in by_id]
    return table, missing


def exact_by_id(cases, results):
    by_id = {r["id"]: r for r in results}
    return {c["id"]: first_line(by_id[c["id"]]["output"]) == c["expected"]
            for c in cases if c["id"] in by_id}


def sign_test(a, b):
    """Two-sided p of a split of a + b coin tosses at least as uneven as a : b."""
    n, k = a + b, min(a, b)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def versus(cases, first, other):
    """Rows (language, cases, exact first, exact other, only first, only other) over the cases
    both results hold."""
    a, b = exact_by_id(cases, first), exact_by_id(cases, other)
    rows = {}
    for c in cases:
        if c["id"] not in a or c["id"] not in b:
            continue
        x, y = a[c["id"]], b[c["id"]]
        for lang in (c["language"], "all"):
            r = rows.setdefault(lang, [0, 0, 0, 0, 0])
            r[0] += 1
            r[1] += x
            r[2] += y
            r[3] += x and not y
            r[4] += y and not x
    order = [lang for lang in LANGUAGES if lang in rows] + sorted(set(rows) - set(LANGUAGES) - {"all"})
    return [(lang, *rows[lang]) for lang in order + ["all"] if lang in rows]


def bootstrap(cases, first, other, draws, goal, seed=0):
    """Per language (and `every`, all languages at once): the 5th and 95th percentile of the
    exact-line ratio first/other over `draws` paired resamples of the cases within each
    language, and the share of resamples with a ratio of at least `goal`."""
    a, b = exact_by_id(cases, first), exact_by_id(cases, other)
    pairs = {}
    for c in cases:
        if c["id"] in a and c["id"] in b:
            pairs.setdefault(c["language"], []).append((a[c["id"]], b[c["id"]]))
    langs = [lang for lang in LANGUAGES if lang in pairs] + sorted(set(pairs) - set(LANGUAGES))
    rng = random.Random(seed)
    ratios = {lang: [] for lang in langs}
    every = 0
    for _ in range(draws):
        ok = True
        for lang in langs:
            drawn = rng.choices(pairs[lang], k=len(pairs[lang]))
            x, y = sum(p[0] for p in drawn), sum(p[1] for p in drawn)
            r = x / y if y else (math.inf if x else 1.0)
            ratios[lang].append(r)
            ok = ok and r >= goal
        every += ok
    out = {}
    for lang in langs:
        rs = sorted(ratios[lang])
        out[lang] = (rs[int(0.05 * (draws - 1))], rs[int(0.95 * (draws - 1))],
                     sum(r >= goal for r in rs) / draws)
    out["every"] = (None, None, every / draws)
    return out


def failures(results):
    """How many answers record a failed completion (laya writes `error` for those)."""
    return sum(1 for r in results if r.get("error"))


def rerank(results, how, expected=None):
    """The results with each output picked from its alternatives by `how` (see --rank);
    `expected` (id -> line) is needed for `any`."""
    def pick(r):
        alts = r.get("alternatives") or []
        if not alts:
            return r["output"]
        if how == "greedy":
            return next((a["text"] for a in alts if a["choice"] == 0), "")
        if how == "any":
            hit = [a["text"] for a in alts if first_line(a["text"]) == expected.get(r["id"])]
            return hit[0] if hit else r["output"]
        key = {"mean": lambda a: a.get("logprob", -math.inf) / max(a["tokens"], 1),
               "sum": lambda a: a.get("logprob", -math.inf)}[how]
        best = max(alts, key=key)  # the first of equals, in laya's order
        return best["text"]
    return [dict(r, output=pick(r)) for r in results]


def load_results(path):
    docs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in path.split("+")]
    return dict(docs[0], results=[r for d in docs for r in d["results"]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--cases", action="append",
                    help="case file (repeat for several; default: cases.jsonl beside this script)")
    ap.add_argument("--json", action="store_true", help="print the tables as JSON")
    ap.add_argument("--versus", action="store_true",
                    help="compare the first results file with each of the others, case by case")
    ap.add_argument("--rank", choices=["greedy", "mean", "sum", "any"],
                    help="pick each answer again from its recorded alternatives (see above)")
    ap.add_argument("--bootstrap", type=int, metavar="N",
                    help="with --versus: N paired resamples per language (see above)")
    ap.add_argument("--goal", type=float, default=1.05, help="the ratio --bootstrap counts (1.05)")
    ap.add_argument("--strip-leading", action="store_true",
                    help="diagnostic: also trim the first line's leading whitespace")
    args = ap.parse_args()
    cases = [json.loads(line) for f in args.cases or [Path(__file__).with_name("cases.jsonl")]
             for line in Path(f).read_text(encoding="utf-8").splitlines() if line.strip()]
    expected = {c["id"]: c["expected"] for c in cases}

    def results_of(path, first=False):
        rs = load_results(path)["results"]
        return rerank(rs, args.rank, expected) if args.rank and (first or not args.versus) else rs

    if args.versus:
        if len(args.results) < 2:
            ap.error("--versus needs at least two results files")
        first = results_of(args.results[0], first=True)
        for path in args.results[1:]:
            rows = versus(cases, first, results_of(path))
            print(f"{args.results[0]} against {path}")
            print(f"  {'language':<12}{'n':>5}{'exact':>8}{'other':>8}{'ratio':>8}{'only':>6}{'other':>7}")
            for lang, n, ea, eb, oa, ob in rows:
                ratio = f"{ea / eb:.2f}" if eb else "inf" if ea else "-"
                print(f"  {lang:<12}{n:>5}{ea:>8}{eb:>8}{ratio:>8}{oa:>6}{ob:>7}")
            _, _, _, _, oa, ob = rows[-1]
            print(f"  sign test on the {oa + ob} cases one engine alone gets right: p = {sign_test(oa, ob):.3f}")
            if args.bootstrap:
                print(f"  {args.bootstrap} resampled sets of the same size: ratio, 5th-95th percentile;"
                      f" share of sets with a ratio of at least {args.goal}")
                for lang, (lo, hi, share) in bootstrap(cases, first, results_of(path),
                                                       args.bootstrap, args.goal).items():
                    span = f"{lo:.2f}-{hi:.2f}" if lo is not None else "(all at once)"
                    print(f"  {lang:<12}{span:>14}{share:>8.1%}")
        return
    out = {}
    for path in args.results:
        doc = load_results(path)
        doc["results"] = results_of(path)
        table, missing = score(cases, doc["results"], args.strip_leading)
        failed = failures(doc["results"])
        out[path] = {"engine": doc.get("engine"), "model": doc.get("model"),
                     "table": table, "missing": len(missing), "failed": failed}
        if args.json:
            continue
        print(f"{path}: {doc.get('engine')} {doc.get('version', '')} {doc.get('model', '')}"
              + (f" ({len(missing)} of {len(cases)} cases missing)" if missing else "")
              + (f" ({failed} completions failed, scored as misses)" if failed else "")
              + (f" [--rank {args.rank}]" if args.rank else "")
              + (" [--strip-leading diagnostic]" if args.strip_leading else ""))
        print(f"  {'language':<12}{'n':>4}{'exact-line':>12}{'edit sim':>10}")
        for lang, t in table.items():
            print(f"  {lang:<12}{t['n']:>4}{t['exact_line']:>12.3f}{t['edit_similarity']:>10.3f}")
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
