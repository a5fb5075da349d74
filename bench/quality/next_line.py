#!/usr/bin/env python3
"""What dropping answers that repeat the next line does to recorded answers.

    python3 bench/quality/next_line.py --cases CASES.jsonl RESULTS.json [RESULTS.json ...]

laya's post-processing drops an answer whose first line, completed as the cursor's line (the
text before the cursor, the answer's first line and, for a one-line answer, what stays after
it), is the next non-blank line after the cursor's line (`repeats_next_line` in
src/completion/postprocess.rs; the same comparison is written again here). This applies that
rule to answers recorded before it existed and prints, per results file: how many answers it
drops, how many of those were exact lines (lost), and exact lines before and after. A stand-in
for running `laya bench quality` again: the rule only removes answers, so the rest of each
answer is what the engine wrote.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from score import first_line  # noqa: E402

CLOSERS = set(")]}\"'`;,>")


def replace_len(text, line_suffix):
    """How many bytes after the cursor a one-line answer replaces (merge_closers)."""
    rest = line_suffix.rstrip()
    if rest and text.endswith(rest):
        return len(rest)
    i = len(text)
    while i > 0 and text[i - 1] in CLOSERS:
        i -= 1
    tail = text[i:]
    for j in range(len(tail)):
        if rest.startswith(tail[j:]):
            return len(tail[j:])
    return 0


def repeats_next_line(answer, prefix, suffix):
    line_prefix = prefix[prefix.rfind("\n") + 1:]
    eol = suffix.find("\n")
    line_suffix = suffix if eol < 0 else suffix[:eol]
    line_suffix = line_suffix[:-1] if line_suffix.endswith("\r") else line_suffix
    after_line = "" if eol < 0 else suffix[eol + 1:]
    nxt = next((l for l in after_line.split("\n") if l.strip()), None)
    if nxt is None or not answer.strip():
        return False
    if "\n" in answer:
        first, rest = answer.split("\n", 1)[0], ""
    else:
        first, rest = answer, line_suffix[replace_len(answer, line_suffix):]
    return (line_prefix + first + rest).rstrip() == nxt.rstrip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", required=True, action="append")
    ap.add_argument("results", nargs="+")
    args = ap.parse_args()
    cases = {}
    for f in args.cases:
        for line in open(f, encoding="utf-8"):
            c = json.loads(line)
            cases[c["id"]] = c
    print("results | answers | dropped | of them exact | exact before | exact after")
    for path in args.results:
        results = json.load(open(path, encoding="utf-8"))["results"]
        answers = dropped = lost = before = after = 0
        for r in results:
            c = cases.get(r["id"])
            if c is None:
                continue
            answers += 1
            out = r.get("output", "")
            hit = first_line(out) == c["expected"].rstrip()
            before += hit
            if repeats_next_line(out, c["prefix"], c["suffix"]):
                dropped += 1
                lost += hit
            else:
                after += hit
        print(f"{Path(path).name} | {answers} | {dropped} | {lost} | {before} | {after}")


if __name__ == "__main__":
    main()
