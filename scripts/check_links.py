#!/usr/bin/env python3
"""Fails naming every relative link or repository path that points at nothing. No network.

Checked:
- Markdown files (all of the repository's, vendored mlx-c and build outputs aside): each
  relative link `[text](target)` / `![alt](target)` / `[ref]: target`, resolved against the
  file's folder; an anchor `#x` must be a heading of the target (or the same) Markdown file.
- Rust doc comments (`//!`, `///`) of laya's own .rs files: Markdown links whose target is a
  path (not an intra-doc link or a URL), backticked repository paths (`docs/decisions.md`,
  `scripts/gpu/`, `../x.md`, `src/tests/`) and bare `docs/...` / `scripts/...` paths,
  resolved against the file's folder, its crate's root, that crate's `src/` and the
  repository root (the first that exists wins); anchors are not checked there.
Code blocks and inline code are skipped in Markdown; in Rust docs only fenced blocks are.
Usage: scripts/check_links.py [--verbose]. Exit 1 with one line per dangling target.
Intra-doc links (`[`Item`]`) are rustdoc's to check:
`RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps` (minutes on a cold target).
"""

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SKIP_DIRS = {".git", "target", "node_modules", "mlx-c", ".venv", "venv", "__pycache__"}
RUST_ROOTS = ["src", "tests", "examples", "benches", "build.rs", "crates/laya-engine", "crates/mlx-sys"]
# Top-level folders whose paths a doc comment may name in backticks.
REPO_DIRS = ("docs", "scripts", "bench", "editors", "queries", "examples", "tests", "src", "crates", ".ci")
PATH_CHARS = r"[A-Za-z0-9_.+-]"
BACKTICK_PATH = re.compile(
    rf"^(?:\.\.?/)*(?:{'|'.join(re.escape(d) for d in REPO_DIRS)}|\.\.?)/(?:{PATH_CHARS}+/?)*$"
)
# Paths doc comments give as examples of a user's project, not as files of this repository.
EXAMPLES = {"src/x.py", "src/a/b.rs", "src/a/b/mod.rs", "src/a/b"}
BARE_PATH = re.compile(rf"(?<![\w/`.-])(?:docs|scripts)/(?:{PATH_CHARS}+/)*{PATH_CHARS}*\w")
MD_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
MD_REF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
FENCE = re.compile(r"^\s*(```|~~~).*?^\s*\1\s*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)


def walk(rel, ext):
    top = os.path.join(ROOT, rel)
    if os.path.isfile(top):
        if top.endswith(ext):
            yield top
        return
    for d, dirs, files in os.walk(top):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        for f in sorted(files):
            if f.endswith(ext):
                yield os.path.join(d, f)


def is_external(target):
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None or target.startswith("//")


def slugs(md_path, cache={}):
    """GitHub's heading anchors of a Markdown file."""
    if md_path not in cache:
        text = FENCE.sub("", open(md_path, encoding="utf-8").read())
        seen, out = {}, set()
        for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
            title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
            s = re.sub(r"[^\w\- ]", "", title.lower().replace("`", "")).replace(" ", "-")
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
        for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", text):
            out.add(m.group(1))
        cache[md_path] = out
    return cache[md_path]


CHECKED = [0]


def check_markdown(path, errors):
    text = open(path, encoding="utf-8").read()
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    text = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), text)
    targets = [m.group(2) for m in MD_LINK.finditer(text)] + [m.group(1) for m in MD_REF.finditer(text)]
    for target in targets:
        if not target or is_external(target):
            continue
        CHECKED[0] += 1
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            errors.append(f"{rel(path)}: link to missing {target}")
        elif anchor and dest.endswith(".md") and anchor.lower() not in slugs(dest):
            errors.append(f"{rel(path)}: link to missing heading {target}")


def crate_root(path):
    d = os.path.dirname(path)
    while d.startswith(ROOT):
        if os.path.exists(os.path.join(d, "Cargo.toml")):
            return d
        d = os.path.dirname(d)
    return ROOT


def doc_blocks(path):
    """The text of each run of consecutive doc-comment lines."""
    block = []
    for line in open(path, encoding="utf-8"):
        m = re.match(r"\s*//[/!](?!/)\s?(.*)$", line)
        if m:
            block.append(m.group(1))
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)


def check_rust(path, errors):
    root = crate_root(path)
    bases = [os.path.dirname(path), root, os.path.join(root, "src"), ROOT]
    for block in doc_blocks(path):
        block = FENCE.sub("", block)
        refs = []
        for m in MD_LINK.finditer(block):
            target = m.group(2)
            if not target or is_external(target) or target.startswith("#"):
                continue
            # An intra-doc link names an item, not a file.
            if "::" in target or re.fullmatch(r"[A-Za-z_][\w]*(\(\)|!)?", target):
                continue
            refs.append(target)
        for m in re.finditer(r"`([^`\n]+)`", block):
            if BACKTICK_PATH.match(m.group(1)) and m.group(1) not in EXAMPLES:
                refs.append(m.group(1))
        prose = re.sub(r"`[^`\n]*`", "", block)
        refs += [m.group(0) for m in BARE_PATH.finditer(prose)]
        for target in refs:
            CHECKED[0] += 1
            file_part = target.partition("#")[0]
            if not any(os.path.exists(os.path.join(b, file_part)) for b in bases):
                errors.append(f"{rel(path)}: doc comment names missing {target}")


def rel(path):
    return os.path.relpath(path, ROOT)


def main():
    errors = []
    md = sorted(set(walk(".", ".md")))
    rs = sorted({p for r in RUST_ROOTS for p in walk(r, ".rs")})
    for path in md:
        check_markdown(path, errors)
    for path in rs:
        check_rust(path, errors)
    for e in errors:
        print(e, file=sys.stderr)
    if "--verbose" in sys.argv or errors:
        print(f"check_links: {len(md)} Markdown files, {len(rs)} Rust files, "
              f"{CHECKED[0]} links and paths, {len(errors)} dangling",
              file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
