#!/usr/bin/env python3
"""Builds the cross-file cases of `laya bench quality`: masked lines that use a symbol defined in
another file of a real multi-file project, with the project on disk as the workspace.

    python3 bench/quality/make_repo_cases.py pack [--only NAME ...] [--pypi-dir DIR]
        [--cargo-src DIR] [--mirror-dir DIR]
    python3 bench/quality/make_repo_cases.py cases [--repos DIR] [--out-dir DIR]

`pack` trims each project of PROJECTS to its source files (tests, docs, examples and binaries
dropped; package markers, manifests, headers and the license kept) and writes it, deterministic
byte for byte, to bench/quality/repos/<name>.tar.xz with every path under `<name>/`. It needs the
projects' sources (the options say where; README.md says how to get them).

`cases` needs only those archives. For every project it reads the archive, indexes what each
file defines (functions, methods, types, fields, constants, enum members, Python keyword
parameters: `ast` for Python, a small lexer and brace-scope patterns for the other languages)
and keeps the masked-line candidates (make_cases.py's eligibility rules) whose line uses a
symbol that

  - another file of the project defines, at most MAX_DEFINERS of them;
  - occurs nowhere else in the current file, comments and strings included (so neither the
    prefix nor the suffix, nor an import line, reveals the name);
  - is at least MIN_SYMBOL chars long, not a keyword nor a common standard-library name
    (STOP_NAMES), and occurs in no other project of the same language in PROJECTS (a name
    that several unrelated projects use is the language's or a library's, not this project's).

The masked line must also not occur (whitespace-trimmed) elsewhere in the file. Each project's
candidates, in path and line order, are split into as many contiguous runs as cases wanted
and one is drawn from each run (random.Random("laya-repo-v1:<name>")). Cases are written with
the file window of make_cases.py's `--window file` (up to 12000 bytes before, 3000 after) to
cases-repo.jsonl (split "tune") and cases-repo-xl.jsonl (split "heldout", other projects), and
each again xz-compressed (`.jsonl.xz`, the committed form).

Only the Python standard library is used.
"""

import argparse
import ast
import fnmatch
import glob
import io
import json
import lzma
import os
import random
import re
import subprocess
import sys
import tarfile
import tokenize
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_cases  # noqa: E402  (eligibility rules and windows of the single-file sets)

SEED = "laya-repo-v1"
MIN_SYMBOL = 4  # characters
MAX_DEFINERS = 3  # files of the project that define the symbol
PREFIX_BYTES = make_cases.FILE_PREFIX_BYTES
SUFFIX_BYTES = make_cases.FILE_SUFFIX_BYTES
LANGUAGES = make_cases.LANGUAGES
SPLITS = {"tune": ("cases-repo.jsonl", "R"), "heldout": ("cases-repo-xl.jsonl", "RX")}
# Cases wanted per language: ~100 tune and ~200 held-out over 6 languages, shared over the
# language's projects of the split (a project with fewer candidates gives all it has, the
# others share the rest).
PER_LANGUAGE = {"tune": 17, "heldout": 34}

# Sources of the case files per language (the archives keep other files too).
CASE_EXT = {"python": (".py",), "rust": (".rs",), "typescript": (".ts", ".tsx"),
            "go": (".go",), "c": (".c",), "java": (".java",)}
# Files indexed for definitions.
DEF_EXT = {"python": (".py",), "rust": (".rs",), "typescript": (".ts", ".tsx"),
           "go": (".go",), "c": (".c", ".h"), "java": (".java",)}


class Project:
    def __init__(self, name, language, split, desc, license, origin, keep, drop=()):
        self.name, self.language, self.split = name, language, split
        self.desc, self.license = desc, license
        self.origin = origin  # ("pypi", sdist dir) | ("cargo", crate dir) | ("git", mirror, commit)
        self.keep, self.drop = keep, drop


_TESTS = ("*/test/*", "*/tests/*", "*_test.go", "*/testdata/*", "*.test.ts", "*.spec.ts",
          "*/__tests__/*", "*/examples/*", "*/example/*", "*/_examples/*", "*/benches/*",
          "*/docs/*", "*/fuzz/*", "*/fuzzing/*", "*/testes/*")

PROJECTS = [
    # --- tune -----------------------------------------------------------------------------
    Project("h11", "python", "tune", "PyPI h11 0.14.0", "MIT",
            ("pypi", "h11-0.14.0"),
            ["h11/*.py", "h11/py.typed", "setup.py", "setup.cfg", "pyproject.toml",
             "LICENSE.txt"]),
    Project("click", "python", "tune", "PyPI click 8.1.7", "BSD-3-Clause",
            ("pypi", "click-8.1.7"),
            ["src/click/*.py", "src/click/py.typed", "setup.py", "setup.cfg", "LICENSE.rst"]),
    Project("toml_edit", "rust", "tune", "crate toml_edit 0.22.27", "MIT OR Apache-2.0",
            ("cargo", "toml_edit-0.22.27"),
            ["src/*.rs", "src/**/*.rs", "Cargo.toml", "LICENSE-MIT", "LICENSE-APACHE"]),
    Project("indicatif", "rust", "tune", "crate indicatif 0.17.11", "MIT",
            ("cargo", "indicatif-0.17.11"), ["src/*.rs", "src/**/*.rs", "Cargo.toml", "LICENSE"]),
    Project("ky", "typescript", "tune", "sindresorhus/ky @3419113b", "MIT",
            ("git", "sindresorhus+ky", "3419113b48e034fdcf8fa6bd3be3da7b3d0d758f"),
            ["source/*.ts", "source/**/*.ts", "package.json", "tsconfig.json", "license"]),
    Project("vue", "typescript", "tune",
            "vuejs/core @e2bede96 (packages reactivity, shared, compiler-core)", "MIT",
            ("git", "vuejs+core", "e2bede96134f757aad5c5b33ac9be055022dbfc8"),
            ["packages/reactivity/src/*", "packages/reactivity/src/**",
             "packages/shared/src/*", "packages/compiler-core/src/*",
             "packages/compiler-core/src/**", "packages/reactivity/package.json",
             "packages/shared/package.json", "packages/compiler-core/package.json",
             "package.json", "tsconfig.json", "LICENSE"]),
    Project("chi", "go", "tune", "go-chi/chi @735ae2b8", "MIT",
            ("git", "go-chi+chi", "735ae2b87f8c733d616e809ae86e0985c1bc3350"),
            ["*.go", "middleware/*.go", "go.mod", "LICENSE"]),
    Project("logrus", "go", "tune", "sirupsen/logrus @87434bb3", "MIT",
            ("git", "sirupsen+logrus", "87434bb3a736e2a27d34df66924471714f408d3d"),
            ["*.go", "hooks/*/*.go", "go.mod", "LICENSE"], ["example_*.go"]),
    Project("libyaml", "c", "tune", "yaml/libyaml @840b65c4", "MIT",
            ("git", "yaml+libyaml", "840b65c40675e2d06bf40405ad3f12dec7f35923"),
            ["src/*.c", "src/*.h", "include/*.h", "CMakeLists.txt", "License"]),
    Project("hiredis", "c", "tune", "redis/hiredis @29ea2791", "BSD-3-Clause",
            ("git", "redis+hiredis", "29ea2791c102fdffff350f1ea6e04d1f71903d0d"),
            ["*.c", "*.h", "adapters/*.h", "CMakeLists.txt", "COPYING"], ["test.c"]),
    Project("gson", "java", "tune", "google/gson @9835b6f9", "Apache-2.0",
            ("git", "google+gson", "9835b6f90192f79cdf5300c528fc6212455fb6c1"),
            ["gson/src/main/java/**", "gson/pom.xml", "pom.xml", "LICENSE"]),
    Project("javapoet", "java", "tune", "square/javapoet @b9017a95", "Apache-2.0",
            ("git", "square+javapoet", "b9017a9503b76e11b4ad4c1a9f050e2d29112cb0"),
            ["src/main/java/**", "pom.xml", "LICENSE.txt"]),
    # --- held out -------------------------------------------------------------------------
    Project("attrs", "python", "heldout", "PyPI attrs 23.2.0", "MIT",
            ("pypi", "attrs-23.2.0"),
            ["src/attr/*.py", "src/attr/*.pyi", "src/attr/py.typed", "src/attrs/*.py",
             "src/attrs/*.pyi", "src/attrs/py.typed", "pyproject.toml", "LICENSE"]),
    Project("marshmallow", "python", "heldout", "PyPI marshmallow 3.21.1", "MIT",
            ("pypi", "marshmallow-3.21.1"),
            ["src/marshmallow/*.py", "src/marshmallow/py.typed", "pyproject.toml", "LICENSE",
             "NOTICE"]),
    Project("jinja2", "python", "heldout", "PyPI Jinja2 3.1.4", "BSD-3-Clause",
            ("pypi", "jinja2-3.1.4"),
            ["src/jinja2/*.py", "src/jinja2/py.typed", "pyproject.toml", "LICENSE.txt"]),
    Project("httpx", "python", "heldout", "PyPI httpx 0.27.0", "BSD-3-Clause",
            ("pypi", "httpx-0.27.0"),
            ["httpx/*.py", "httpx/**/*.py", "httpx/py.typed", "pyproject.toml", "LICENSE.md"]),
    Project("clap_builder", "rust", "heldout", "crate clap_builder 4.6.7", "MIT OR Apache-2.0",
            ("cargo", "clap_builder-4.6.7"),
            ["src/*.rs", "src/**/*.rs", "Cargo.toml", "LICENSE-MIT", "LICENSE-APACHE"]),
    Project("ureq", "rust", "heldout", "crate ureq 2.12.1", "MIT OR Apache-2.0",
            ("cargo", "ureq-2.12.1"),
            ["src/*.rs", "src/**/*.rs", "Cargo.toml", "LICENSE-MIT", "LICENSE-APACHE"]),
    Project("hono", "typescript", "heldout", "honojs/hono @28a9c128", "MIT",
            ("git", "honojs+hono", "28a9c128912de19f3fb28b00ae289c9b93f6f392"),
            ["src/*.ts", "src/**/*.ts", "src/**/*.tsx", "package.json", "tsconfig.json",
             "LICENSE"]),
    Project("mobx", "typescript", "heldout", "mobxjs/mobx @01211a69 (packages/mobx)", "MIT",
            ("git", "mobxjs+mobx", "01211a698b64ea94de8e5f276ff8235fcf8ddf96"),
            ["packages/mobx/src/*", "packages/mobx/src/**", "packages/mobx/package.json",
             "packages/mobx/tsconfig.json", "package.json", "tsconfig.json", "LICENSE"]),
    Project("gin", "go", "heldout", "gin-gonic/gin @dcaa4296", "MIT",
            ("git", "gin-gonic+gin", "dcaa4296d111981ffb31ac3eba90bb63e1eb5ab9"),
            ["*.go", "*/*.go", "*/*/*.go", "go.mod", "LICENSE"]),
    Project("urfave-cli", "go", "heldout", "urfave/cli @1305a082", "MIT",
            ("git", "urfave+cli", "1305a08200f7c4d873e28bd2bbad1ff257c6cfc4"),
            ["*.go", "go.mod", "LICENSE"], ["example*.go", "*/autocomplete/*"]),
    Project("jansson", "c", "heldout", "akheron/jansson @a8b3c599", "MIT",
            ("git", "akheron+jansson", "a8b3c5999e752d895030360c553ba66fa6630ed0"),
            ["src/*.c", "src/*.h", "src/*.def", "CMakeLists.txt", "LICENSE"]),
    Project("lua", "c", "heldout", "lua/lua @53b41d0c", "MIT",
            ("git", "lua+lua", "53b41d0cddd80bf33fdc631bdd32e3ba53842b89"),
            ["*.c", "*.h", "makefile"], ["ltests.c", "ltests.h", "onelua.c"]),
    Project("jsoup", "java", "heldout", "jhy/jsoup @46b62086", "MIT",
            ("git", "jhy+jsoup", "46b620860af930eedc193a705eaf7cea5aec89a6"),
            ["src/main/java/**", "pom.xml", "LICENSE"]),
    Project("commons-cli", "java", "heldout", "apache/commons-cli @0a68ae0e", "Apache-2.0",
            ("git", "apache+commons-cli", "0a68ae0e826bb08eb59bda9bae7ec5d84008b62a"),
            ["src/main/java/**", "pom.xml", "LICENSE.txt", "NOTICE.txt"]),
]

# ---------------------------------------------------------------------------------------------
# Packing


def _matches(path, patterns):
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def source_files(project, roots):
    """(path, bytes) of the project's kept files, sorted by path."""
    kind = project.origin[0]
    files = {}
    if kind in ("pypi", "cargo"):
        base = Path(roots[kind]) / project.origin[1]
        for p in sorted(base.rglob("*")):
            if p.is_file():
                files[p.relative_to(base).as_posix()] = p.read_bytes()
    else:
        git_dir = Path(roots["git"]) / project.origin[1] / "repo"
        data = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar",
                               project.origin[2]], check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            for m in t.getmembers():
                if m.isfile():
                    files[m.name] = t.extractfile(m).read()
    out = []
    for path in sorted(files):
        wrapped = "/" + path  # so "*/tests/*" also matches a top-level tests/
        if not _matches(path, project.keep):
            continue
        if _matches(wrapped, _TESTS) or _matches(path, project.drop):
            continue
        if project.language == "typescript" and path.endswith(".d.ts"):
            continue
        out.append((path, files[path]))
    return out


def pack(project, roots, out_dir):
    files = source_files(project, roots)
    if not files:
        raise SystemExit(f"{project.name}: no files (is its source at the root?)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for path, data in files:
            info = tarfile.TarInfo(f"{project.name}/{path}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            t.addfile(info, io.BytesIO(data))
    packed = lzma.compress(buf.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                           preset=9 | lzma.PRESET_EXTREME)
    out = Path(out_dir) / f"{project.name}.tar.xz"
    out.write_bytes(packed)
    raw = sum(len(d) for _, d in files)
    print(f"{out}: {len(files)} files, {raw} bytes, {len(packed)} packed", file=sys.stderr)


def read_workspace(path):
    """{path inside the workspace: text} of the UTF-8 files of an archive (others skipped)."""
    files = {}
    with tarfile.open(path, mode="r:xz") as t:
        for m in t.getmembers():
            if not m.isfile():
                continue
            name = m.name.split("/", 1)[1]
            try:
                files[name] = t.extractfile(m).read().decode("utf-8")
            except UnicodeDecodeError:
                pass
    return files


# ---------------------------------------------------------------------------------------------
# Lexing: code with comments and string contents blanked (newlines kept, so offsets and line
# numbers stay), for the C-like languages.


def blank(text, language):
    out = list(text)
    state, close, depth = "code", "", 0
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if state == "code":
            two = text[i:i + 2]
            if two == "//":
                j = text.find("\n", i)
                j = n if j < 0 else j
                wipe(i, j)
                i = j
                continue
            if two == "/*":
                state, depth, start = "block", 1, i
                i += 2
                continue
            if language == "java" and text.startswith('"""', i):
                state, close, start = "raw", '"""', i + 3
                i += 3
                continue
            if language == "rust":
                m = re.match(r'(?:b|c)?r(#*)"', text[i:i + 260])
                if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                    state, close, start = "raw", '"' + m.group(1), i + m.end()
                    i += m.end()
                    continue
            if c == '"' or (c == "`" and language in ("go", "typescript")):
                state = "raw" if (c == "`" and language == "go") else "str"
                close, start = c, i + 1
                i += 1
                continue
            if c == "'":
                if language == "rust":
                    m = re.match(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'",
                                 text[i:i + 16])
                    i += m.end() if m else 1  # a char literal, or a lifetime or label
                    continue
                state, close, start = "str", "'", i + 1
                i += 1
                continue
            i += 1
            continue
        if state == "block":
            if text.startswith("*/", i):
                depth -= 1
                i += 2
                if depth == 0:
                    wipe(start, i)
                    state = "code"
                continue
            if language == "rust" and text.startswith("/*", i):
                depth += 1
                i += 2
                continue
            i += 1
            continue
        if state == "str":
            if c == "\\":
                i += 2
                continue
            if c == close or (c == "\n" and close != "`"):
                wipe(start, i)
                state = "code"
            i += 1
            continue
        if state == "raw":
            if text.startswith(close, i):
                wipe(start, i)
                state = "code"
                i += len(close)
                continue
            i += 1
    if state != "code":
        wipe(start, n)
    return "".join(out)


def blank_python(text):
    """Python source with string contents and comments blanked (tokenize; the text as it is
    when it does not tokenize)."""
    out = list(text)
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.STRING, tokenize.COMMENT):
                (sr, sc), (er, ec) = tok.start, tok.end
                a, b = offsets[sr - 1] + sc, offsets[er - 1] + ec
                if tok.type == tokenize.STRING:
                    q = re.match(r"[A-Za-z]*('''|\"\"\"|'|\")", text[a:b])
                    a += q.end() if q else 0
                    b -= len(q.group(1)) if q else 0
                for k in range(a, max(a, b)):
                    if out[k] != "\n":
                        out[k] = " "
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return "".join(out)


IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")

# ---------------------------------------------------------------------------------------------
# Definitions


def python_defs(text):
    """{name: kind} of what a Python file defines; kind "parameter" for function parameters
    (which only a keyword argument uses)."""
    defs = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return defs

    def add(name, kind):
        if kind != "parameter" or name not in defs:
            defs[name] = kind

    def targets(node):
        if isinstance(node, (ast.Assign,)):
            return node.targets
        if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            return [node.target]
        return []

    def visit_body(body, in_class):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                add(node.name, "method" if in_class else "function")
                a = node.args
                for arg in a.posonlyargs + a.args + a.kwonlyargs:
                    if arg.arg not in ("self", "cls"):
                        add(arg.arg, "parameter")
                for sub in ast.walk(node):
                    for t in targets(sub):
                        if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                                and t.value.id == "self"):
                            add(t.attr, "attribute")
            elif isinstance(node, ast.ClassDef):
                add(node.name, "class")
                visit_body(node.body, True)
            else:
                for t in targets(node):
                    for name in ast.walk(t):
                        if isinstance(name, ast.Name):
                            add(name.id, "attribute" if in_class else "variable")
                if isinstance(node, (ast.If, ast.Try)):
                    visit_body(node.body, in_class)
                    visit_body(getattr(node, "orelse", []), in_class)
                    for h in getattr(node, "handlers", []):
                        visit_body(h.body, in_class)

    visit_body(tree.body, False)
    return defs


def scopes(code, language):
    """For each line of blanked `code`: the kind of block it starts in ("top", "type" for
    class/struct/interface/impl/trait bodies, "enum", "other")."""
    kinds = ["top"]
    line_kind = []
    seg_start = 0
    at_line_start = True
    for i, c in enumerate(code):
        if at_line_start:
            line_kind.append(kinds[-1])
            at_line_start = False
        if c == "\n":
            at_line_start = True
        elif c == "{":
            header = code[seg_start:i]
            kinds.append(classify(header, language, kinds[-1]))
            seg_start = i + 1
        elif c == "}":
            if len(kinds) > 1:
                kinds.pop()
            seg_start = i + 1
        elif c == ";":
            seg_start = i + 1
    if at_line_start:
        line_kind.append(kinds[-1])
    return line_kind


def classify(header, language, outer):
    h = " ".join(header.split())
    if language == "rust":
        if re.search(r"\b(impl|trait)\b", h) and not re.search(r"\bfn\b", h):
            return "type"
        if re.search(r"\b(struct|union)\b", h) and not re.search(r"[=(]", h.split("struct")[0]):
            return "type" if re.search(r"\b(struct|union)\s+\w+", h) else "other"
        if re.search(r"\benum\s+\w+", h):
            return "enum"
        if re.search(r"\bmod\s+\w+\s*$", h):
            return "top"
        return "other"
    if language == "go":
        if re.search(r"\b(struct|interface)\s*$", h):
            return "type"
        return "other"
    if language == "typescript":
        if re.search(r"\b(class|interface)\b[^=(]*$", h):
            return "type"
        if re.search(r"\benum\s+\w+\s*$", h):
            return "enum"
        if re.search(r"\b(namespace|module)\s+[\w.\"']+\s*$", h) or re.search(r"declare global\s*$", h):
            return "top"
        if re.search(r"^\s*(export\s+)?type\s+\w+(<[^=]*>)?\s*=\s*$", h):
            return "type"
        return "other"
    if language == "c":
        if re.search(r"\b(struct|union)\b(\s+\w+)?\s*$", h):
            return "type"
        if re.search(r"\benum\b(\s+\w+)?\s*$", h):
            return "enum"
        if re.search(r'extern\s+"C"\s*$', h) or re.search(r"extern\s*$", h):
            return "top"
        return "other"
    if language == "java":
        if re.search(r"\b(class|interface|record|@interface)\s+\w+", h) and outer in ("top", "type", "enum"):
            return "type"
        if re.search(r"\benum\s+\w+", h):
            return "enum"
        return "other"
    return "other"


JAVA_MODS = r"(?:(?:public|protected|private|static|final|abstract|synchronized|native|default|strictfp|transient|volatile|sealed|non-sealed)\s+)*"
TS_MODS = r"(?:(?:public|private|protected|static|readonly|abstract|override|declare|async|get|set|accessor|export|default)\s+)*"

PATTERNS = {
    "rust": {
        "any": [(r"\b(?:fn|struct|enum|union|trait|type|const|static(?:\s+mut)?|mod)\s+([A-Za-z_]\w*)", "item"),
                (r"macro_rules!\s*([A-Za-z_]\w*)", "macro")],
        "type": [(r"^\s*(?:pub(?:\([^)]*\))?\s+)?([a-z_]\w*)\s*:(?!:)", "field")],
        "enum": [(r"^\s*([A-Z]\w*)\s*(?:[,({=]|$)", "variant")],
    },
    "go": {
        "top": [(r"^func\s+(?:\([^)]*\)\s*)?([A-Za-z_]\w*)", "function"),
                (r"^(?:type|const|var)\s+([A-Za-z_]\w*)", "item")],
        "type": [(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s+[\w*\[\]{}.()]", "field"),
                 (r"^\s*([A-Za-z_]\w*)\s*\(", "method")],
    },
    "typescript": {
        "top": [(r"\b(?:function\*?|class|interface|type|enum|namespace)\s+([A-Za-z_$][\w$]*)", "item"),
                (r"^\s*(?:export\s+)?(?:declare\s+)?(?:const|let|var)\s+([A-Za-z_$][\w$]*)", "variable")],
        "type": [(r"^\s*" + TS_MODS + r"#?([A-Za-z_$][\w$]*)\s*[?!]?\s*(?:[(:=<;]|$)", "member")],
        "enum": [(r"^\s*([A-Za-z_$][\w$]*)\s*(?:=|,|$)", "enum member")],
    },
    "c": {
        "any": [(r"^\s*#\s*define\s+([A-Za-z_]\w*)", "macro"),
                (r"\b(?:struct|union|enum)\s+([A-Za-z_]\w*)", "type")],
        "top": [(r"\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*(?:\{|;|$)", "function"),
                (r"\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])*\s*(?:=|;)", "variable"),
                (r"\b([A-Za-z_]\w*)\s*\)\s*\(", "function type")],
        "type": [(r"\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])*\s*(?::\s*\w+)?\s*[;,]", "field"),
                 (r"\(\s*\*\s*([A-Za-z_]\w*)\s*\)\s*\(", "field")],
        "enum": [(r"^\s*([A-Za-z_]\w*)\s*(?:=|,|$)", "enum member")],
    },
    "java": {
        "any": [(r"\b(?:class|interface|enum|record|@interface)\s+([A-Za-z_]\w*)", "type")],
        "type": [(r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*" + JAVA_MODS + r"(?:<[^>]*>\s*)?[\w.$<>\[\],? ]+?\s+([A-Za-z_]\w*)\s*\(", "method"),
                 (r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*" + JAVA_MODS + r"[\w.$<>\[\],? ]+?\s+([A-Za-z_]\w*)\s*(?:=|;|,)", "field")],
        "enum": [(r"^\s*([A-Z][A-Z0-9_]*)\s*(?:[(,;{]|$)", "enum constant")],
    },
}
PATTERNS["java"]["enum"] += PATTERNS["java"]["type"]


def clike_defs(text, language):
    code = blank(text, language)
    lines = code.split("\n")
    kinds = scopes(code, language)
    pats = {k: [(re.compile(p), kind) for p, kind in v] for k, v in PATTERNS[language].items()}
    defs = {}
    for i, line in enumerate(lines):
        where = kinds[i] if i < len(kinds) else "top"
        for group in ("any", where):
            for rx, kind in pats.get(group, []):
                for m in rx.finditer(line):
                    for name in re.split(r"\s*,\s*", m.group(1)):
                        if name and name not in KEYWORDS[language]:
                            defs.setdefault(name, kind)
    if language == "go":  # grouped declarations: const ( ... ), var ( ... ), type ( ... )
        for m in re.finditer(r"^(?:const|var|type)\s*\(\n(.*?)^\)", code, re.S | re.M):
            for line in m.group(1).split("\n"):
                mm = re.match(r"^\s*([A-Za-z_]\w*)\b", line)
                if mm and mm.group(1) not in KEYWORDS["go"]:
                    defs.setdefault(mm.group(1), "item")
    return defs


def file_defs(text, language):
    return python_defs(text) if language == "python" else clike_defs(text, language)


# ---------------------------------------------------------------------------------------------
# Names that are the language's, or too common to point at one definition.

KEYWORDS = {
    "python": set("False None True and as assert async await break class continue def del elif "
                  "else except finally for from global if import in is lambda nonlocal not or "
                  "pass raise return try while with yield self cls match case".split()),
    "rust": set("as async await break const continue crate dyn else enum extern false fn for if "
                "impl in let loop match mod move mut pub ref return self Self static struct super "
                "trait true type unsafe use where while union".split()),
    "go": set("break case chan const continue default defer else fallthrough for func go goto if "
              "import interface map package range return select struct switch type var nil true "
              "false iota".split()),
    "typescript": set("abstract any as async await boolean break case catch class const "
                      "constructor continue declare default delete do else enum export extends "
                      "false finally for from function get if implements import in infer "
                      "instanceof interface is keyof let module namespace never new null number "
                      "object of package private protected public readonly return satisfies set "
                      "static string super switch symbol this throw true try type typeof undefined "
                      "unique unknown var void while with yield".split()),
    "c": set("auto break case char const continue default do double else enum extern float for "
             "goto if inline int long register restrict return short signed sizeof static struct "
             "switch typedef union unsigned void volatile while bool true false NULL".split()),
    "java": set("abstract assert boolean break byte case catch char class const continue default "
                "do double else enum extends final finally float for goto if implements import "
                "instanceof int interface long native new package private protected public "
                "return short static strictfp super switch synchronized this throw throws "
                "transient try void volatile while var record yield null true false".split()),
}

# Standard-library names that a project's own definitions often share (a use of them is more
# likely the library's).
STOP_NAMES = {
    "python": set("""__init__ __call__ __repr__ __str__ __eq__ __hash__ __iter__ __next__ __len__
        __getitem__ __setitem__ __contains__ __enter__ __exit__ __name__ __class__ __dict__
        append extend insert remove items keys values update format strip split join startswith
        endswith replace lower upper encode decode setdefault popitem copy clear index count find
        sort sorted reverse reversed read write close flush readline seek tell isinstance
        issubclass getattr setattr hasattr delattr print open range list dict tuple frozenset
        super property staticmethod classmethod object type string bytes isdigit isalpha rstrip
        lstrip partition rpartition splitlines casefold title center ljust rjust zfill
        discard union intersection difference add pop get set name value args kwargs kwds
        callable iter next enumerate filter zip min max sum any all abs round repr hash
        Exception ValueError TypeError KeyError AttributeError RuntimeError stdout stderr stdin
        environ path""".split()),
    "rust": set("""unwrap expect clone into from iter iter_mut into_iter collect push push_str
        insert remove contains contains_key get_mut is_empty map map_err and_then ok_or
        ok_or_else unwrap_or unwrap_or_else unwrap_or_default as_ref as_mut as_str as_bytes
        to_string to_owned borrow borrow_mut write write_str write_fmt next peek take skip chain
        filter filter_map enumerate rev find position count fold extend drain retain truncate
        split splitn trim starts_with ends_with with_capacity capacity reserve default Default
        Some None Box String Option Result Arc Mutex HashMap BTreeMap HashSet lock load store
        Ordering partial_cmp hash deref drop clone_from display Display Debug Formatter format
        println assert debug_assert matches panic unreachable writeln is_some is_none is_ok
        is_err as_deref copied cloned last first replace swap flush read read_to_string chars
        bytes lines parse to_vec join concat sort sort_by sort_by_key dedup windows chunks
        split_at as_slice as_ptr Self self""".split()),
    "go": set("""Error String Errorf Sprintf Printf Println Fprintf Fprintln Sprint Write Read
        Close append make copy delete panic recover string byte bool error Context Background
        Lock Unlock RLock RUnlock Done Wait ServeHTTP Header Handler HandlerFunc Request
        ResponseWriter WriteHeader Get Set Add Del Len Less Swap Name Value""".split()),
    "typescript": set("""length push pop shift unshift slice splice concat join indexOf includes
        forEach filter reduce some every find findIndex keys values entries assign freeze
        create toString valueOf hasOwnProperty then catch finally resolve reject Promise Error
        Array Object String Number Boolean Symbol Map Set WeakMap WeakSet JSON parse stringify
        console log warn error Math floor ceil random isArray from call apply bind prototype
        constructor name value delete clear size has get set add createElement appendChild
        removeChild insertBefore replaceChild setAttribute getAttribute removeAttribute
        addEventListener removeEventListener querySelector dispatchEvent preventDefault
        headers status statusText body json text arrayBuffer blob formData clone signal
        abort fetch Request Response Headers URL URLSearchParams send pathname hostname origin
        href protocol search hash respondWith waitUntil""".split()),
    "c": set("""malloc calloc realloc free memcpy memmove memset memcmp strlen strcmp strncmp
        strcpy strncpy strcat strchr strrchr strstr strdup sprintf snprintf vsnprintf printf
        fprintf fputs fwrite fread fopen fclose assert size_t uint8_t uint16_t uint32_t uint64_t
        int8_t int16_t int32_t int64_t intptr_t uintptr_t ssize_t errno exit abort va_list
        va_start va_end va_arg isdigit isalpha isspace isalnum tolower toupper""".split()),
    "java": set("""toString equals hashCode getClass length charAt substring indexOf append
        add remove contains containsKey put size isEmpty iterator hasNext next close String
        Object Integer Long Boolean Character StringBuilder List Map Set ArrayList HashMap
        LinkedHashMap HashSet Collections Arrays Objects Override IllegalArgumentException
        IllegalStateException NullPointerException IOException getMessage valueOf format
        isAssignableFrom readObject writeObject readResolve writeReplace getName getType
        getValue setValue getKey compareTo compare clone finalize forEach stream iterator
        getDeclaredFields getDeclaredMethods getModifiers getSuperclass getComponentType
        isArray isPrimitive isInterface isInstance cast newInstance getCause printStackTrace
        hasMoreElements nextElement run call apply accept test flush write read""".split()),
}


def words(text):
    return set(IDENT.findall(text))


# ---------------------------------------------------------------------------------------------
# Cases


def line_uses(body, language):
    """[(name, kind of use)] on a masked line: kind "kwarg" for Python keyword arguments."""
    if language == "python":
        code = blank_python(body + "\n").rstrip("\n")
    else:
        code = blank(body, language)
    uses = []
    for m in IDENT.finditer(code):
        name = m.group(0)
        if language != "typescript" and "$" in name:
            continue
        if m.start() > 0 and (code[m.start() - 1].isdigit()):
            continue
        kind = "name"
        if language == "python":
            after = code[m.end():]
            before = code[:m.start()].rstrip()
            if re.match(r"\s*=(?!=)", after) and (before.endswith(("(", ",")) or
                                                  (not before and re.match(r"=(?!=)", after))):
                kind = "kwarg"
        uses.append((name, kind))
    return uses


def project_cases(project, files, other_words):
    lang = project.language
    defs = {p: file_defs(t, lang) for p, t in files.items() if p.endswith(DEF_EXT[lang])}
    definers = {}
    for p, d in defs.items():
        for name, kind in d.items():
            definers.setdefault(name, []).append((p, kind))
    stop = KEYWORDS[lang] | STOP_NAMES[lang]
    candidates = []
    for path in sorted(files):
        if not path.endswith(CASE_EXT[lang]) or (lang == "typescript" and path.endswith(".d.ts")):
            continue
        text = files[path]
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        raw = [ln + "\n" for ln in lines]
        try:
            eligible = eligible_lines(text, lang)
        except (SyntaxError, tokenize.TokenError, IndentationError):
            continue
        counts = {}
        for w in IDENT.findall(text):
            counts[w] = counts.get(w, 0) + 1
        stripped_lines = {}
        for ln in lines:
            s = ln.strip()
            stripped_lines[s] = stripped_lines.get(s, 0) + 1
        here = defs.get(path, {})
        imports = import_lines(text, lang)
        for i in eligible:
            if i in imports:
                continue  # import, use, include and re-export lines name the symbol already
            body = lines[i].rstrip()
            if stripped_lines[body.strip()] > 1:
                continue  # the file holds the same line elsewhere
            on_line = {}
            for w in IDENT.findall(body):
                on_line[w] = on_line.get(w, 0) + 1
            symbols = []
            for name, use in line_uses(body, lang):
                if len(name) < MIN_SYMBOL or name in stop or name in other_words:
                    continue
                if counts.get(name, 0) != on_line.get(name, 0):
                    continue  # the file names it elsewhere
                if name in here:
                    continue  # the line defines it (a definition, not a use)
                where = [(p, k) for p, k in definers.get(name, []) if p != path and
                         ((k == "parameter") == (use == "kwarg"))]
                if not where or len(definers[name]) > MAX_DEFINERS:
                    continue
                if any(s["symbol"] == name for s in symbols):
                    continue
                symbols.append({"symbol": name, "kind": where[0][1] if use != "kwarg"
                                else "keyword argument",
                                "defined_in": sorted(p for p, _ in where)})
            if not symbols:
                continue
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            before, after = [], []
            size = 0
            for j in range(i - 1, -1, -1):
                b = len(raw[j].encode("utf-8"))
                if size + b > PREFIX_BYTES:
                    break
                before.append(raw[j])
                size += b
            before.reverse()
            size = 0
            for j in range(i + 1, len(lines)):
                b = len(raw[j].encode("utf-8"))
                if size + b > SUFFIX_BYTES:
                    break
                after.append(raw[j])
                size += b
            candidates.append({"path": path, "line": i + 1,
                               "prefix": "".join(before) + indent,
                               "suffix": "\n" + "".join(after),
                               "expected": body[len(indent):], "cross_file": symbols})
    return candidates


def pick(project, candidates, k):
    """k candidates, one from each of k contiguous runs (seeded per project)."""
    rng = random.Random(f"{SEED}:{project.name}")
    k = min(k, len(candidates))
    picked = []
    for r in range(k):
        lo, hi = r * len(candidates) // k, (r + 1) * len(candidates) // k
        picked.append(candidates[rng.randrange(lo, hi)])
    return picked


def shares(counts, total):
    """Cases per project: `total` shared as evenly as the candidate counts allow (the projects
    with fewest candidates first; one with too few gives all it has)."""
    out, left = [0] * len(counts), total
    order = sorted(range(len(counts)), key=lambda i: (counts[i], i))
    for pos, i in enumerate(order):
        out[i] = min(counts[i], -(-left // (len(order) - pos)))
        left -= out[i]
    return out


def import_lines(text, language):
    """0-based numbers of the lines of import, use, include and re-export statements."""
    out = set()
    if language == "python":
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return out
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update(range(node.lineno - 1, node.end_lineno))
        return out
    code = blank(text, language)
    rx = {
        "rust": r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:use|extern\s+crate|mod)\b[^;{]*(?:\{[^;]*)?;",
        "typescript": r"^[ \t]*(?:import\b[^;]*?(?:\bfrom\s*)?[\"'`][^\n]*|export\s+(?:type\s+)?(?:\*|\{[^}]*\})(?:\s*as\s+\w+)?\s*(?:from\s*[\"'][^\n]*)?)",
        "go": r"^import\s*(?:\(.*?^\)|[^\n]*)|^package\b[^\n]*",
        "c": r"^[ \t]*#\s*include\b[^\n]*",
        "java": r"^[ \t]*(?:import|package)\b[^;]*;",
    }[language]
    for m in re.finditer(rx, code, re.M | re.S):
        a = code.count("\n", 0, m.start())
        out.update(range(a, a + m.group(0).count("\n") + 1))
    return out


def eligible_lines(text, language):
    """0-based numbers of the lines make_cases.py would accept as masked lines (its rules, with
    the window check on the 1200/400-byte line window)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    nlines = len(lines)
    if language == "python":
        blocked = make_cases.python_blocked(text, nlines)
    else:
        blocked = make_cases.clike_blocked(text, nlines, language)
    raw = [ln + "\n" for ln in lines]
    out = []
    for i, ln in enumerate(lines):
        stripped = ln.strip()
        if blocked[i] or not stripped:
            continue
        if len(re.sub(r"\s", "", stripped)) < make_cases.MIN_CHARS or \
                len(stripped) > make_cases.MAX_CHARS:
            continue
        if make_cases.TRIVIAL.match(stripped):
            continue
        if language == "python" and stripped.endswith(":") and re.match(
                r"(else|try|finally)\b", stripped):
            continue
        if i == 0:
            continue
        lo, size = i, 0
        while lo > 0 and size + len(raw[lo - 1].encode("utf-8")) <= make_cases.PREFIX_BYTES:
            lo -= 1
            size += len(raw[lo].encode("utf-8"))
        if lo == i:
            continue
        hi, size = i + 1, 0
        while hi < nlines and size + len(raw[hi].encode("utf-8")) <= make_cases.SUFFIX_BYTES:
            size += len(raw[hi].encode("utf-8"))
            hi += 1
        if any(raw[j].strip() == stripped for j in list(range(lo, i)) + list(range(i + 1, hi))):
            continue
        out.append(i)
    return out


def build_cases(repos_dir, out_dir):
    workspaces = {p.name: read_workspace(Path(repos_dir) / f"{p.name}.tar.xz") for p in PROJECTS}
    vocab = {p.name: set().union(*(words(t) for path, t in workspaces[p.name].items()
                                   if path.endswith(DEF_EXT[p.language])))
             for p in PROJECTS}
    summary = []
    for split, (out_name, mark) in SPLITS.items():
        out = []
        for language in LANGUAGES:
            found = []
            for project in [p for p in PROJECTS if p.split == split and p.language == language]:
                others = set().union(*(vocab[q.name] for q in PROJECTS
                                       if q.language == language and q.name != project.name))
                found.append((project, project_cases(project, workspaces[project.name], others)))
            wanted = shares([len(c) for _, c in found], PER_LANGUAGE[split])
            for (project, candidates), k in zip(found, wanted):
                picked = pick(project, candidates, k)
                summary.append((split, language, project.name, len(candidates), len(picked)))
                for k, c in enumerate(picked, 1):
                    out.append({
                        "id": f"{language}/{project.name}-{mark}{k}",
                        "language": language,
                        "source": f"{project.desc} {c['path']} line {c['line']} "
                                  f"({project.license})",
                        "file_name": os.path.basename(c["path"]),
                        "prefix": c["prefix"],
                        "suffix": c["suffix"],
                        "expected": c["expected"],
                        "workspace": project.name,
                        "path": c["path"],
                        "cross_file": c["cross_file"],
                    })
        text = "".join(json.dumps(case, ensure_ascii=False) + "\n" for case in out).encode()
        (Path(out_dir) / out_name).write_bytes(text)
        (Path(out_dir) / (out_name + ".xz")).write_bytes(
            lzma.compress(text, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                          preset=9 | lzma.PRESET_EXTREME))
        print(f"wrote {len(out)} cases to {Path(out_dir) / out_name} (and .xz)", file=sys.stderr)
    for split, language, name, n, k in summary:
        print(f"  {split:8} {language:10} {name:14} {n:5} candidates, {k} cases", file=sys.stderr)


def main():
    cargo = sorted(glob.glob(os.path.expanduser("~/.cargo/registry/src/*/")))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="write bench/quality/repos/<name>.tar.xz from the sources")
    p.add_argument("--only", nargs="*", help="project names (default: all)")
    p.add_argument("--pypi-dir", default="/work/scratch/repo-src/py",
                   help="unpacked PyPI sdists, <name>-<version>/ (default: %(default)s)")
    p.add_argument("--cargo-src", default=cargo[0] if cargo else "",
                   help="unpacked crates, <name>-<version>/ (default: %(default)s)")
    p.add_argument("--mirror-dir", default="/work/.mirror",
                   help="bare git repositories as <owner>+<name>/repo (default: %(default)s)")
    p.add_argument("--out-dir", default=str(HERE / "repos"))
    c = sub.add_parser("cases", help="write cases-repo.jsonl and cases-repo-xl.jsonl")
    c.add_argument("--repos", default=str(HERE / "repos"))
    c.add_argument("--out-dir", default=str(HERE))
    args = ap.parse_args()
    if args.cmd == "pack":
        roots = {"pypi": args.pypi_dir, "cargo": args.cargo_src, "git": args.mirror_dir}
        os.makedirs(args.out_dir, exist_ok=True)
        for project in PROJECTS:
            if args.only and project.name not in args.only:
                continue
            pack(project, roots, args.out_dir)
    else:
        build_cases(args.repos, args.out_dir)


if __name__ == "__main__":
    main()
