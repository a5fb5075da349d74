#!/usr/bin/env python3
"""Builds bench/quality/cases.jsonl: masked-line completion cases from real third-party code.

    python3 bench/quality/make_cases.py [--set small|large|xl] [--out FILE] [--per-language N]
        [--python-lib DIR] [--cargo-src DIR] [--npm-dir DIR] [--go-dir DIR] [--jdk-src-zip ZIP]

`--set small` (the default) reads SOURCES and writes cases.jsonl (20 cases a language);
`--set large` reads SOURCES + LARGE_EXTRA_SOURCES and writes cases-large.jsonl (100 a language,
ids `<language>/<slug>-L<n>` so they never name a case of the small set); `--set xl` reads only
XL_SOURCES, files that neither of the other sets reads, and writes cases-xl.jsonl (100 a
language, ids `<language>/<slug>-X<n>`): a held-out set.

Each case masks one line of a source file: `prefix` is the text before the line (whole lines,
at most PREFIX_BYTES bytes, cut at a line boundary from the start) plus the line's indentation,
`expected` is the rest of the line without trailing whitespace, and `suffix` is "\\n" plus the
following whole lines (at most SUFFIX_BYTES bytes). The sources are listed in SOURCES,
LARGE_EXTRA_SOURCES and XL_SOURCES below and in README.md, with where each root comes from.
Selection is deterministic (seeded per file): eligible lines are split into as many contiguous
runs as cases wanted from the file and one line is drawn from each run, so the cases spread
over the whole file.

Only the Python standard library is used.
"""

import argparse
import glob
import io
import json
import os
import random
import re
import sys
import tokenize
import zipfile
from pathlib import Path

PREFIX_BYTES = 1200
SUFFIX_BYTES = 400
# `--window file`: the same masked lines with much more of the file around them, as an editor
# holds it (an engine then cuts the text to its own budget, and laya's context extraction has
# parts of the file beyond its window to bring back).
FILE_PREFIX_BYTES = 12000
FILE_SUFFIX_BYTES = 3000
MIN_CHARS = 12  # non-space characters in the masked line
MAX_CHARS = 120  # characters in `expected`: longer lines do not fit a 48-token completion
SEED = "laya-quality-v1"

# (language, slug, root, path under the root, description, license). One slug per file; a
# language's cases are shared out evenly over its files (20 over 4 files: 5 each).
SOURCES = [
    ("python", "json-decoder", "python", "json/decoder.py",
     "CPython 3.11.7 Lib/json/decoder.py", "PSF-2.0"),
    ("python", "textwrap", "python", "textwrap.py",
     "CPython 3.11.7 Lib/textwrap.py", "PSF-2.0"),
    ("python", "shlex", "python", "shlex.py",
     "CPython 3.11.7 Lib/shlex.py", "PSF-2.0"),
    ("python", "argparse", "python", "argparse.py",
     "CPython 3.11.7 Lib/argparse.py", "PSF-2.0"),
    ("rust", "anyhow-error", "cargo", "anyhow-1.0.105/src/error.rs",
     "crate anyhow 1.0.105 src/error.rs", "MIT OR Apache-2.0"),
    ("rust", "bytes-bytes-mut", "cargo", "bytes-1.12.2/src/bytes_mut.rs",
     "crate bytes 1.12.2 src/bytes_mut.rs", "MIT"),
    ("rust", "aho-corasick-automaton", "cargo", "aho-corasick-1.1.5/src/automaton.rs",
     "crate aho-corasick 1.1.5 src/automaton.rs", "Unlicense OR MIT"),
    ("rust", "clap-lex", "cargo", "clap_lex-1.1.2/src/lib.rs",
     "crate clap_lex 1.1.2 src/lib.rs", "MIT OR Apache-2.0"),
    ("typescript", "rxjs-subscriber", "npm", "rxjs-7.8.2/package/src/internal/Subscriber.ts",
     "npm rxjs 7.8.2 src/internal/Subscriber.ts", "Apache-2.0"),
    ("typescript", "rxjs-timeout", "npm", "rxjs-7.8.2/package/src/internal/operators/timeout.ts",
     "npm rxjs 7.8.2 src/internal/operators/timeout.ts", "Apache-2.0"),
    ("typescript", "zod-util", "npm", "zod-4.6.7/package/src/v4/core/util.ts",
     "npm zod 4.6.7 src/v4/core/util.ts", "MIT"),
    ("typescript", "zod-schemas", "npm", "zod-4.6.7/package/src/v4/core/schemas.ts",
     "npm zod 4.6.7 src/v4/core/schemas.ts", "MIT"),
    ("go", "cobra-command", "go", "cobra/command.go",
     "spf13/cobra @adbc8813 command.go", "Apache-2.0"),
    ("go", "cobra-completions", "go", "cobra/completions.go",
     "spf13/cobra @adbc8813 completions.go", "Apache-2.0"),
    ("go", "mux-mux", "go", "mux/mux.go",
     "gorilla/mux @db9d1d00 mux.go", "BSD-3-Clause"),
    ("go", "mux-route", "go", "mux/route.go",
     "gorilla/mux @db9d1d00 route.go", "BSD-3-Clause"),
    ("c", "tree-sitter-query", "cargo", "tree-sitter-0.27.1/src/query.c",
     "tree-sitter 0.27.1 lib/src/query.c (crate tree-sitter)", "MIT"),
    ("c", "tree-sitter-subtree", "cargo", "tree-sitter-0.27.1/src/subtree.c",
     "tree-sitter 0.27.1 lib/src/subtree.c (crate tree-sitter)", "MIT"),
    ("c", "oniguruma-regexec", "cargo", "onig_sys-69.9.3/oniguruma/src/regexec.c",
     "Oniguruma 6.9 src/regexec.c (crate onig_sys 69.9.3)", "BSD-2-Clause"),
    ("c", "tree-sitter-python-scanner", "cargo", "tree-sitter-python-0.25.0/src/scanner.c",
     "tree-sitter-python 0.25.0 src/scanner.c (crate tree-sitter-python)", "MIT"),
    ("java", "jdk-arraylist", "jdk", "java.base/java/util/ArrayList.java",
     "OpenJDK 25 (Temurin 25.0.3) java.base/java/util/ArrayList.java",
     "GPL-2.0-only WITH Classpath-exception-2.0"),
    ("java", "jdk-hashmap", "jdk", "java.base/java/util/HashMap.java",
     "OpenJDK 25 (Temurin 25.0.3) java.base/java/util/HashMap.java",
     "GPL-2.0-only WITH Classpath-exception-2.0"),
    ("java", "jdk-arraydeque", "jdk", "java.base/java/util/ArrayDeque.java",
     "OpenJDK 25 (Temurin 25.0.3) java.base/java/util/ArrayDeque.java",
     "GPL-2.0-only WITH Classpath-exception-2.0"),
    ("java", "jdk-scanner", "jdk", "java.base/java/util/Scanner.java",
     "OpenJDK 25 (Temurin 25.0.3) java.base/java/util/Scanner.java",
     "GPL-2.0-only WITH Classpath-exception-2.0"),
]

# More files for the large set (`--set large`): SOURCES first, then these, so a language has 10
# files (Go 6: the two repositories have no other files with enough code) and 100 cases shared
# evenly over them. The small set (cases.jsonl) does not read these.
_JDK = "OpenJDK 25 (Temurin 25.0.3) "
_JDK_LICENSE = "GPL-2.0-only WITH Classpath-exception-2.0"
LARGE_EXTRA_SOURCES = [
    ("python", "json-encoder", "python", "json/encoder.py",
     "CPython 3.11.7 Lib/json/encoder.py", "PSF-2.0"),
    ("python", "difflib", "python", "difflib.py",
     "CPython 3.11.7 Lib/difflib.py", "PSF-2.0"),
    ("python", "configparser", "python", "configparser.py",
     "CPython 3.11.7 Lib/configparser.py", "PSF-2.0"),
    ("python", "dataclasses", "python", "dataclasses.py",
     "CPython 3.11.7 Lib/dataclasses.py", "PSF-2.0"),
    ("python", "fractions", "python", "fractions.py",
     "CPython 3.11.7 Lib/fractions.py", "PSF-2.0"),
    ("python", "pprint", "python", "pprint.py",
     "CPython 3.11.7 Lib/pprint.py", "PSF-2.0"),
    ("rust", "serde-json-de", "cargo", "serde_json-1.0.154/src/de.rs",
     "crate serde_json 1.0.154 src/de.rs", "MIT OR Apache-2.0"),
    ("rust", "smallvec", "cargo", "smallvec-1.16.6/src/lib.rs",
     "crate smallvec 1.16.6 src/lib.rs", "MIT OR Apache-2.0"),
    ("rust", "indexmap-map", "cargo", "indexmap-2.14.2/src/map.rs",
     "crate indexmap 2.14.2 src/map.rs", "Apache-2.0 OR MIT"),
    ("rust", "url-parser", "cargo", "url-2.5.8/src/parser.rs",
     "crate url 2.5.8 src/parser.rs", "MIT OR Apache-2.0"),
    ("rust", "ropey-rope", "cargo", "ropey-1.6.1/src/rope.rs",
     "crate ropey 1.6.1 src/rope.rs", "MIT"),
    ("rust", "regex-syntax-literal", "cargo", "regex-syntax-0.8.12/src/hir/literal.rs",
     "crate regex-syntax 0.8.12 src/hir/literal.rs", "MIT OR Apache-2.0"),
    ("typescript", "rxjs-observable", "npm", "rxjs-7.8.2/package/src/internal/Observable.ts",
     "npm rxjs 7.8.2 src/internal/Observable.ts", "Apache-2.0"),
    ("typescript", "rxjs-ajax", "npm", "rxjs-7.8.2/package/src/internal/ajax/ajax.ts",
     "npm rxjs 7.8.2 src/internal/ajax/ajax.ts", "Apache-2.0"),
    ("typescript", "rxjs-test-scheduler", "npm",
     "rxjs-7.8.2/package/src/internal/testing/TestScheduler.ts",
     "npm rxjs 7.8.2 src/internal/testing/TestScheduler.ts", "Apache-2.0"),
    ("typescript", "zod-checks", "npm", "zod-4.6.7/package/src/v4/core/checks.ts",
     "npm zod 4.6.7 src/v4/core/checks.ts", "MIT"),
    ("typescript", "zod-api", "npm", "zod-4.6.7/package/src/v4/core/api.ts",
     "npm zod 4.6.7 src/v4/core/api.ts", "MIT"),
    ("typescript", "zod-errors", "npm", "zod-4.6.7/package/src/v4/core/errors.ts",
     "npm zod 4.6.7 src/v4/core/errors.ts", "MIT"),
    ("go", "mux-regexp", "go", "mux/regexp.go",
     "gorilla/mux @db9d1d00 regexp.go", "BSD-3-Clause"),
    ("go", "cobra-bash-completions", "go", "cobra/bash_completions.go",
     "spf13/cobra @adbc8813 bash_completions.go", "Apache-2.0"),
    ("c", "tree-sitter-parser", "cargo", "tree-sitter-0.27.1/src/parser.c",
     "tree-sitter 0.27.1 lib/src/parser.c (crate tree-sitter)", "MIT"),
    ("c", "tree-sitter-stack", "cargo", "tree-sitter-0.27.1/src/stack.c",
     "tree-sitter 0.27.1 lib/src/stack.c (crate tree-sitter)", "MIT"),
    ("c", "tree-sitter-lexer", "cargo", "tree-sitter-0.27.1/src/lexer.c",
     "tree-sitter 0.27.1 lib/src/lexer.c (crate tree-sitter)", "MIT"),
    ("c", "oniguruma-regcomp", "cargo", "onig_sys-69.9.3/oniguruma/src/regcomp.c",
     "Oniguruma 6.9 src/regcomp.c (crate onig_sys 69.9.3)", "BSD-2-Clause"),
    ("c", "oniguruma-regparse", "cargo", "onig_sys-69.9.3/oniguruma/src/regparse.c",
     "Oniguruma 6.9 src/regparse.c (crate onig_sys 69.9.3)", "BSD-2-Clause"),
    ("c", "tree-sitter-javascript-scanner", "cargo", "tree-sitter-javascript-0.25.0/src/scanner.c",
     "tree-sitter-javascript 0.25.0 src/scanner.c (crate tree-sitter-javascript)", "MIT"),
    ("java", "jdk-linkedlist", "jdk", "java.base/java/util/LinkedList.java",
     _JDK + "java.base/java/util/LinkedList.java", _JDK_LICENSE),
    ("java", "jdk-treemap", "jdk", "java.base/java/util/TreeMap.java",
     _JDK + "java.base/java/util/TreeMap.java", _JDK_LICENSE),
    ("java", "jdk-priorityqueue", "jdk", "java.base/java/util/PriorityQueue.java",
     _JDK + "java.base/java/util/PriorityQueue.java", _JDK_LICENSE),
    ("java", "jdk-bitset", "jdk", "java.base/java/util/BitSet.java",
     _JDK + "java.base/java/util/BitSet.java", _JDK_LICENSE),
    ("java", "jdk-base64", "jdk", "java.base/java/util/Base64.java",
     _JDK + "java.base/java/util/Base64.java", _JDK_LICENSE),
    ("java", "jdk-regex-matcher", "jdk", "java.base/java/util/regex/Matcher.java",
     _JDK + "java.base/java/util/regex/Matcher.java", _JDK_LICENSE),
]

# The held-out set (`--set xl`): only these files, none of which SOURCES or LARGE_EXTRA_SOURCES
# names, from other modules, crates, packages and repositories where there are any. 100 cases a
# language shared evenly over its files (10 files: 10 each; Go has 8: 13, 13, 13, 13, 12, ...).
_PY = "CPython 3.11.7 Lib/"
_PFLAG = "spf13/pflag @5fdac2d1 "  # 5fdac2d16c16d60605cb8baa887e8c5c38ef623f
_WEBSOCKET = "gorilla/websocket @e064f32e "  # e064f32e3674d9d79a8fd417b5bc06fa5c6cad8f
_TOML = "BurntSushi/toml @d733fc53 "  # d733fc535e4a9f3c454e421a87b90ade5d49bf31
XL_SOURCES = [
    ("python", "ipaddress", "python", "ipaddress.py", _PY + "ipaddress.py", "PSF-2.0"),
    ("python", "statistics", "python", "statistics.py", _PY + "statistics.py", "PSF-2.0"),
    ("python", "tokenize", "python", "tokenize.py", _PY + "tokenize.py", "PSF-2.0"),
    ("python", "calendar", "python", "calendar.py", _PY + "calendar.py", "PSF-2.0"),
    ("python", "datetime", "python", "datetime.py", _PY + "datetime.py", "PSF-2.0"),
    ("python", "tarfile", "python", "tarfile.py", _PY + "tarfile.py", "PSF-2.0"),
    ("python", "pathlib", "python", "pathlib.py", _PY + "pathlib.py", "PSF-2.0"),
    ("python", "enum", "python", "enum.py", _PY + "enum.py", "PSF-2.0"),
    ("python", "http-cookiejar", "python", "http/cookiejar.py", _PY + "http/cookiejar.py",
     "PSF-2.0"),
    ("python", "gettext", "python", "gettext.py", _PY + "gettext.py", "PSF-2.0"),
    ("rust", "httparse", "cargo", "httparse-1.10.1/src/lib.rs",
     "crate httparse 1.10.1 src/lib.rs", "MIT OR Apache-2.0"),
    ("rust", "http-header-map", "cargo", "http-1.5.0/src/header/map.rs",
     "crate http 1.5.0 src/header/map.rs", "MIT OR Apache-2.0"),
    ("rust", "slab", "cargo", "slab-0.4.12/src/lib.rs",
     "crate slab 0.4.12 src/lib.rs", "MIT"),
    ("rust", "either", "cargo", "either-1.19.0/src/lib.rs",
     "crate either 1.19.0 src/lib.rs", "MIT OR Apache-2.0"),
    ("rust", "hashbrown-map", "cargo", "hashbrown-0.17.2/src/map.rs",
     "crate hashbrown 0.17.2 src/map.rs", "MIT OR Apache-2.0"),
    ("rust", "regex-automata-strategy", "cargo", "regex-automata-0.4.19/src/meta/strategy.rs",
     "crate regex-automata 0.4.19 src/meta/strategy.rs", "MIT OR Apache-2.0"),
    ("rust", "crossbeam-deque", "cargo", "crossbeam-deque-0.8.8/src/deque.rs",
     "crate crossbeam-deque 0.8.8 src/deque.rs", "MIT OR Apache-2.0"),
    ("rust", "memchr-memmem-searcher", "cargo", "memchr-2.8.3/src/memmem/searcher.rs",
     "crate memchr 2.8.3 src/memmem/searcher.rs", "Unlicense OR MIT"),
    ("rust", "tokio-mpsc-chan", "cargo", "tokio-1.54.1/src/sync/mpsc/chan.rs",
     "crate tokio 1.54.1 src/sync/mpsc/chan.rs", "MIT"),
    ("rust", "hyper-h1-role", "cargo", "hyper-1.12.0/src/proto/h1/role.rs",
     "crate hyper 1.12.0 src/proto/h1/role.rs", "MIT"),
    ("typescript", "query-core-query", "npm", "tanstack-query-core-5.108.4/package/src/query.ts",
     "npm @tanstack/query-core 5.108.4 src/query.ts", "MIT"),
    ("typescript", "query-core-query-observer", "npm",
     "tanstack-query-core-5.108.4/package/src/queryObserver.ts",
     "npm @tanstack/query-core 5.108.4 src/queryObserver.ts", "MIT"),
    ("typescript", "query-core-query-client", "npm",
     "tanstack-query-core-5.108.4/package/src/queryClient.ts",
     "npm @tanstack/query-core 5.108.4 src/queryClient.ts", "MIT"),
    ("typescript", "immer-patches", "npm", "immer-11.2.14/package/src/plugins/patches.ts",
     "npm immer 11.2.14 src/plugins/patches.ts", "MIT"),
    ("typescript", "immer-finalize", "npm", "immer-11.2.14/package/src/core/finalize.ts",
     "npm immer 11.2.14 src/core/finalize.ts", "MIT"),
    ("typescript", "immer-proxy", "npm", "immer-11.2.14/package/src/core/proxy.ts",
     "npm immer 11.2.14 src/core/proxy.ts", "MIT"),
    ("typescript", "zod-classic-schemas", "npm", "zod-4.6.7/package/src/v4/classic/schemas.ts",
     "npm zod 4.6.7 src/v4/classic/schemas.ts", "MIT"),
    ("typescript", "zod-to-json-schema", "npm", "zod-4.6.7/package/src/v4/core/to-json-schema.ts",
     "npm zod 4.6.7 src/v4/core/to-json-schema.ts", "MIT"),
    ("typescript", "rxjs-websocket-subject", "npm",
     "rxjs-7.8.2/package/src/internal/observable/dom/WebSocketSubject.ts",
     "npm rxjs 7.8.2 src/internal/observable/dom/WebSocketSubject.ts", "Apache-2.0"),
    ("typescript", "rxjs-subject", "npm", "rxjs-7.8.2/package/src/internal/Subject.ts",
     "npm rxjs 7.8.2 src/internal/Subject.ts", "Apache-2.0"),
    ("go", "pflag-flag", "go", "pflag/flag.go", _PFLAG + "flag.go", "BSD-3-Clause"),
    ("go", "websocket-conn", "go", "websocket/conn.go", _WEBSOCKET + "conn.go", "BSD-2-Clause"),
    ("go", "websocket-client", "go", "websocket/client.go", _WEBSOCKET + "client.go",
     "BSD-2-Clause"),
    ("go", "websocket-server", "go", "websocket/server.go", _WEBSOCKET + "server.go",
     "BSD-2-Clause"),
    ("go", "toml-decode", "go", "toml/decode.go", _TOML + "decode.go", "MIT"),
    ("go", "toml-encode", "go", "toml/encode.go", _TOML + "encode.go", "MIT"),
    ("go", "toml-parse", "go", "toml/parse.go", _TOML + "parse.go", "MIT"),
    ("go", "toml-lex", "go", "toml/lex.go", _TOML + "lex.go", "MIT"),
    ("c", "tree-sitter-node", "cargo", "tree-sitter-0.27.1/src/node.c",
     "tree-sitter 0.27.1 lib/src/node.c (crate tree-sitter)", "MIT"),
    ("c", "tree-sitter-tree-cursor", "cargo", "tree-sitter-0.27.1/src/tree_cursor.c",
     "tree-sitter 0.27.1 lib/src/tree_cursor.c (crate tree-sitter)", "MIT"),
    ("c", "tree-sitter-get-changed-ranges", "cargo", "tree-sitter-0.27.1/src/get_changed_ranges.c",
     "tree-sitter 0.27.1 lib/src/get_changed_ranges.c (crate tree-sitter)", "MIT"),
    ("c", "tree-sitter-wasm-store", "cargo", "tree-sitter-0.27.1/src/wasm_store.c",
     "tree-sitter 0.27.1 lib/src/wasm_store.c (crate tree-sitter)", "MIT"),
    ("c", "oniguruma-regenc", "cargo", "onig_sys-69.9.3/oniguruma/src/regenc.c",
     "Oniguruma 6.9 src/regenc.c (crate onig_sys 69.9.3)", "BSD-2-Clause"),
    ("c", "oniguruma-unicode", "cargo", "onig_sys-69.9.3/oniguruma/src/unicode.c",
     "Oniguruma 6.9 src/unicode.c (crate onig_sys 69.9.3)", "BSD-2-Clause"),
    ("c", "oniguruma-utf8", "cargo", "onig_sys-69.9.3/oniguruma/src/utf8.c",
     "Oniguruma 6.9 src/utf8.c (crate onig_sys 69.9.3)", "BSD-2-Clause"),
    ("c", "tree-sitter-rust-scanner", "cargo", "tree-sitter-rust-0.24.2/src/scanner.c",
     "tree-sitter-rust 0.24.2 src/scanner.c (crate tree-sitter-rust)", "MIT"),
    ("c", "ring-curve25519", "cargo", "ring-0.17.14/crypto/curve25519/curve25519.c",
     "crate ring 0.17.14 crypto/curve25519/curve25519.c (from BoringSSL)", "Apache-2.0"),
    ("c", "ring-aes-nohw", "cargo", "ring-0.17.14/crypto/fipsmodule/aes/aes_nohw.c",
     "crate ring 0.17.14 crypto/fipsmodule/aes/aes_nohw.c (from BoringSSL)", "ISC"),
    ("java", "jdk-vector", "jdk", "java.base/java/util/Vector.java",
     _JDK + "java.base/java/util/Vector.java", _JDK_LICENSE),
    ("java", "jdk-hashtable", "jdk", "java.base/java/util/Hashtable.java",
     _JDK + "java.base/java/util/Hashtable.java", _JDK_LICENSE),
    ("java", "jdk-identityhashmap", "jdk", "java.base/java/util/IdentityHashMap.java",
     _JDK + "java.base/java/util/IdentityHashMap.java", _JDK_LICENSE),
    ("java", "jdk-uuid", "jdk", "java.base/java/util/UUID.java",
     _JDK + "java.base/java/util/UUID.java", _JDK_LICENSE),
    ("java", "jdk-formatter", "jdk", "java.base/java/util/Formatter.java",
     _JDK + "java.base/java/util/Formatter.java", _JDK_LICENSE),
    ("java", "jdk-stream-collectors", "jdk", "java.base/java/util/stream/Collectors.java",
     _JDK + "java.base/java/util/stream/Collectors.java", _JDK_LICENSE),
    ("java", "jdk-abstractstringbuilder", "jdk", "java.base/java/lang/AbstractStringBuilder.java",
     _JDK + "java.base/java/lang/AbstractStringBuilder.java", _JDK_LICENSE),
    ("java", "jdk-localdate", "jdk", "java.base/java/time/LocalDate.java",
     _JDK + "java.base/java/time/LocalDate.java", _JDK_LICENSE),
    ("java", "jdk-biginteger", "jdk", "java.base/java/math/BigInteger.java",
     _JDK + "java.base/java/math/BigInteger.java", _JDK_LICENSE),
    ("java", "jdk-uri", "jdk", "java.base/java/net/URI.java",
     _JDK + "java.base/java/net/URI.java", _JDK_LICENSE),
]

# set: (sources, default --per-language, default output file name, id suffix before the number)
SETS = {
    "small": (SOURCES, 20, "cases.jsonl", ""),
    "large": (SOURCES + LARGE_EXTRA_SOURCES, 100, "cases-large.jsonl", "L"),
    "xl": (XL_SOURCES, 100, "cases-xl.jsonl", "X"),
}

LANGUAGES = ["python", "rust", "typescript", "go", "c", "java"]


def default_roots():
    cargo = sorted(glob.glob(os.path.expanduser("~/.cargo/registry/src/*/")))
    return {
        "python": "/root/.pyenv/versions/3.11.7/lib/python3.11",
        "cargo": cargo[0] if cargo else "",
        "npm": "/work/scratch/quality-src/npm",
        "go": "/work/scratch/quality-src/go",
        "jdk": "/usr/lib/jvm/temurin-25-jdk-amd64/lib/src.zip",
    }


def read_source(roots, root, rel):
    if root == "jdk":
        with zipfile.ZipFile(roots["jdk"]) as z:
            data = z.read(rel)
    else:
        data = (Path(roots[root]) / rel).read_bytes()
    return data.decode("utf-8")  # strict: only UTF-8 files


# ---------------------------------------------------------------------------------------------
# Which lines are code. `blocked[i]` is true when line i starts inside a block comment or a
# multi-line string, starts with a comment, or carries a trailing comment.


def python_blocked(text, nlines):
    blocked = [False] * nlines
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    first_tok = {}
    for tok in tokens:
        (sr, _), (er, _) = tok.start, tok.end
        if tok.type == tokenize.COMMENT:
            blocked[sr - 1] = True
        if tok.type == tokenize.STRING and er > sr:
            for r in range(sr + 1, er + 1):  # lines that start inside the string
                blocked[r - 1] = True
        if tok.type not in (tokenize.INDENT, tokenize.DEDENT, tokenize.NL, tokenize.NEWLINE):
            first_tok.setdefault(sr, tok)
    # A line that starts with a string token and is only strings: a docstring or string data.
    for row, tok in first_tok.items():
        if tok.type == tokenize.STRING and _only_strings(tokens, row):
            blocked[row - 1] = True
    return blocked


def _only_strings(tokens, row):
    kinds = [t.type for t in tokens if t.start[0] == row and t.type not in (
        tokenize.INDENT, tokenize.DEDENT, tokenize.NL, tokenize.NEWLINE)]
    return all(k == tokenize.STRING for k in kinds)


def clike_blocked(text, nlines, language):
    """A small lexer for C, Java, Rust, Go and TypeScript: comments and string literals."""
    blocked = [False] * nlines
    code_seen = [False] * nlines  # line has code before any comment
    state = "code"  # code | line | block | str | raw
    depth = 0  # nested block comments (Rust)
    close = ""  # closing delimiter of the current string
    line = 0
    line_start_state = ["code"] * nlines
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            if state == "line":
                state = "code"
            line += 1
            if line < nlines:
                line_start_state[line] = state
            i += 1
            continue
        if state == "code":
            two = text[i:i + 2]
            if two == "//":
                state = "line"
                blocked[line] = True  # comment-only or trailing comment
                i += 2
                continue
            if two == "/*":
                state, depth = "block", 1
                blocked[line] = True
                i += 2
                continue
            if not c.isspace():
                code_seen[line] = True
            if language == "java" and text.startswith('"""', i):
                state, close = "raw", '"""'
                i += 3
                continue
            if language == "rust":
                m = re.match(r'(?:b|c)?r(#*)"', text[i:i + 260])
                if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                    state, close = "raw", '"' + m.group(1)
                    i += m.end()
                    continue
            if c == '"':
                state, close = "str", '"'
                i += 1
                continue
            if c == "`" and language in ("go", "typescript"):
                state, close = ("raw", "`") if language == "go" else ("str", "`")
                i += 1
                continue
            if c == "'":
                if language == "rust":
                    m = re.match(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'",
                                 text[i:i + 16])
                    if m:
                        i += m.end()
                    else:
                        i += 1  # a lifetime or label
                    continue
                state, close = "str", "'"
                i += 1
                continue
            i += 1
            continue
        if state == "line":
            i += 1
            continue
        if state == "block":
            if text.startswith("*/", i):
                depth -= 1
                i += 2
                if depth == 0:
                    state = "code"
                continue
            if language == "rust" and text.startswith("/*", i):
                depth += 1
                i += 2
                continue
            i += 1
            continue
        if state == "str":
            if c == "\\" and text[i + 1:i + 2] != "\n":  # the newline is counted above
                i += 2
                continue
            if c == close:
                state = "code"
            i += 1
            continue
        if state == "raw":
            if text.startswith(close, i):
                state = "code"
                i += len(close)
                continue
            i += 1
            continue
    for k in range(nlines):
        if line_start_state[k] != "code":
            blocked[k] = True
    return blocked


TRIVIAL = re.compile(r"^[\s{}()\[\];,:]*(?:else|end|pass|break|continue|return|default)?[\s{}()\[\];,:]*$")


def make_cases_for_file(text, language, k, rng, wide=False):
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    nlines = len(lines)
    if language == "python":
        blocked = python_blocked(text, nlines)
    else:
        blocked = clike_blocked(text, nlines, language)
    raw = [ln + "\n" for ln in lines]

    def window(i, prefix_bytes=PREFIX_BYTES, suffix_bytes=SUFFIX_BYTES):
        before, size = [], 0
        for j in range(i - 1, -1, -1):
            b = len(raw[j].encode("utf-8"))
            if size + b > prefix_bytes:
                break
            before.append(raw[j])
            size += b
        before.reverse()
        after, size = [], 0
        for j in range(i + 1, nlines):
            b = len(raw[j].encode("utf-8"))
            if size + b > suffix_bytes:
                break
            after.append(raw[j])
            size += b
        return before, after

    candidates = []
    for i, ln in enumerate(lines):
        body = ln.rstrip()
        stripped = body.strip()
        if blocked[i] or not stripped:
            continue
        if len(re.sub(r"\s", "", stripped)) < MIN_CHARS or len(stripped) > MAX_CHARS:
            continue
        if TRIVIAL.match(stripped):
            continue
        if language == "python" and stripped.endswith(":") and re.match(
                r"(else|try|finally)\b", stripped):
            continue
        before, after = window(i)
        if not before:
            continue
        if any(x.strip() == stripped for x in before + after):
            continue  # the answer is visible in the window
        indent = ln[: len(ln) - len(ln.lstrip())]
        if wide:  # eligibility as above, so the wide set masks the same lines
            before, after = window(i, FILE_PREFIX_BYTES, FILE_SUFFIX_BYTES)
        candidates.append({
            "line": i + 1,
            "prefix": "".join(before) + indent,
            "suffix": "\n" + "".join(after),
            "expected": body[len(indent):],
        })
    if len(candidates) < k:
        raise SystemExit(f"only {len(candidates)} eligible lines, {k} wanted")
    picked = []
    for r in range(k):
        lo, hi = r * len(candidates) // k, (r + 1) * len(candidates) // k
        picked.append(candidates[rng.randrange(lo, hi)])
    return picked


def main():
    roots = default_roots()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", choices=sorted(SETS), default="small",
                    help="small: cases.jsonl; large: cases-large.jsonl; xl: cases-xl.jsonl, "
                         "held out (default: %(default)s)")
    ap.add_argument("--out", help="default: cases.jsonl, cases-large.jsonl or cases-xl.jsonl "
                    "beside this script")
    ap.add_argument("--window", choices=["line", "file"], default="line",
                    help="line: the prefix/suffix limits above; file: the same cases with up to "
                         f"{FILE_PREFIX_BYTES} bytes before and {FILE_SUFFIX_BYTES} after, written "
                         "to <set's file>-file.jsonl (default: %(default)s)")
    ap.add_argument("--per-language", type=int, help="default: 20 (small) or 100 (large, xl)")
    ap.add_argument("--python-lib", default=roots["python"],
                    help="CPython 3.11.7 Lib/ directory (default: %(default)s)")
    ap.add_argument("--cargo-src", default=roots["cargo"],
                    help="unpacked crates, <name>-<version>/ (default: %(default)s)")
    ap.add_argument("--npm-dir", default=roots["npm"],
                    help="`npm pack` tarballs unpacked to <name>-<version>/ (default: %(default)s)")
    ap.add_argument("--go-dir", default=roots["go"],
                    help="Go repositories as cobra/, mux/, pflag/, websocket/ and toml/ "
                         "(default: %(default)s)")
    ap.add_argument("--jdk-src-zip", default=roots["jdk"], help="default: %(default)s")
    args = ap.parse_args()
    sources, per_language, out_name, id_mark = SETS[args.set]
    if args.per_language is None:
        args.per_language = per_language
    if args.window == "file":
        out_name = out_name.replace(".jsonl", "-file.jsonl")
    if args.out is None:
        args.out = str(Path(__file__).with_name(out_name))
    roots = {"python": args.python_lib, "cargo": args.cargo_src, "npm": args.npm_dir,
             "go": args.go_dir, "jdk": args.jdk_src_zip}

    out = []
    for language in LANGUAGES:
        files = [s for s in sources if s[0] == language]
        for idx, (lang, slug, root, rel, desc, lic) in enumerate(files):
            k = args.per_language // len(files) + (1 if idx < args.per_language % len(files) else 0)
            text = read_source(roots, root, rel)
            rng = random.Random(f"{SEED}:{lang}:{slug}")
            try:
                picked = make_cases_for_file(text, lang, k, rng, wide=args.window == "file")
            except SystemExit as e:
                raise SystemExit(f"{rel}: {e}")
            for n, c in enumerate(picked, 1):
                out.append({
                    "id": f"{lang}/{slug}-{id_mark}{n}",
                    "language": lang,
                    "source": f"{desc} line {c['line']} ({lic})",
                    "file_name": os.path.basename(rel),
                    "prefix": c["prefix"],
                    "suffix": c["suffix"],
                    "expected": c["expected"],
                })
    with open(args.out, "w", encoding="utf-8") as f:
        for case in out:
            f.write(json.dumps(case, ensure_ascii=False) + "\n")
    counts = {}
    for case in out:
        counts[case["language"]] = counts.get(case["language"], 0) + 1
    print(f"wrote {len(out)} cases to {args.out}: "
          + ", ".join(f"{k} {v}" for k, v in counts.items()), file=sys.stderr)


if __name__ == "__main__":
    main()
