#!/usr/bin/env python3
"""Checks of make_repo_cases.py and of the committed cross-file case sets (cases-repo.jsonl.xz,
cases-repo-xl.jsonl.xz) against their workspaces (repos/*.tar.xz).

    python3 bench/quality/test_make_repo_cases.py
"""

import json
import lzma
import re
import unittest
from pathlib import Path

import make_repo_cases as m

HERE = Path(__file__).resolve().parent


def load(name):
    text = lzma.decompress((HERE / name).read_bytes()).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class Rules(unittest.TestCase):
    def test_python_definitions(self):
        defs = m.python_defs(
            "X = 1\nclass A:\n    y = 2\n    def f(self, width, *, deep=False):\n"
            "        self.z = 3\n")
        self.assertEqual(defs["X"], "variable")
        self.assertEqual(defs["A"], "class")
        self.assertEqual(defs["y"], "attribute")
        self.assertEqual(defs["f"], "method")
        self.assertEqual(defs["z"], "attribute")
        self.assertEqual(defs["deep"], "parameter")

    def test_clike_definitions_by_scope(self):
        go = m.clike_defs("package p\n\ntype T struct {\n\tName string\n}\n\n"
                          "func (t *T) Run() {\n\tx := 1\n}\n\nconst (\n\tA = iota\n)\n", "go")
        self.assertEqual(set(go), {"T", "Name", "Run", "A"})
        c = m.clike_defs("#define MAX 3\nstruct s { int len; };\nint f(int a);\n"
                         "static int g(void) {\n  int local = 1;\n  return local;\n}\n", "c")
        self.assertTrue({"MAX", "s", "len", "f", "g"} <= set(c))
        self.assertNotIn("local", c)
        java = m.clike_defs("class K {\n  private int count;\n  public void bump(int by) {\n"
                            "    int t = 1;\n  }\n}\n", "java")
        self.assertEqual(set(java), {"K", "count", "bump"})

    def test_import_lines(self):
        self.assertEqual(m.import_lines("import os\nfrom a import (\n    b,\n)\nx = 1\n",
                                        "python"), {0, 1, 2, 3})
        self.assertEqual(m.import_lines("import { a,\n  b } from './m'\nconst x = 1\n",
                                        "typescript"), {0, 1})
        self.assertEqual(m.import_lines("use crate::{a,\n    b};\nfn f() {}\n", "rust"), {0, 1})

    def test_keyword_arguments(self):
        uses = dict(m.line_uses("f(a, width=3, deep=x == y)", "python"))
        self.assertEqual(uses["width"], "kwarg")
        self.assertEqual(uses["deep"], "kwarg")
        self.assertEqual(uses["x"], "name")

    def test_shares(self):
        self.assertEqual(m.shares([100, 100], 17), [9, 8])
        self.assertEqual(m.shares([7, 24], 17), [7, 10])
        self.assertEqual(m.shares([7, 18, 112, 28], 34), [7, 9, 9, 9])


class CommittedSets(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sets = {split: load(name + ".xz") for split, (name, _) in m.SPLITS.items()}
        cls.workspaces = {p.name: m.read_workspace(HERE / "repos" / f"{p.name}.tar.xz")
                          for p in m.PROJECTS}

    def test_every_project_has_an_archive_and_a_license(self):
        for p in m.PROJECTS:
            files = self.workspaces[p.name]
            self.assertTrue(any(re.search(r"(LICENSE|License|COPYING|license)", f) for f in files)
                            or p.name == "lua", p.name)  # Lua's license is in lua.h
            self.assertTrue(p.license)
        total = sum((HERE / "repos" / f"{p.name}.tar.xz").stat().st_size for p in m.PROJECTS)
        self.assertLess(total, 3_000_000)

    def test_splits_use_different_projects(self):
        names = {split: {c["workspace"] for c in cases} for split, cases in self.sets.items()}
        self.assertFalse(names["tune"] & names["heldout"])
        for split, cases in self.sets.items():
            for c in cases:
                p = next(p for p in m.PROJECTS if p.name == c["workspace"])
                self.assertEqual(p.split, split, c["id"])

    def test_ids_unique_and_languages_covered(self):
        ids = [c["id"] for cases in self.sets.values() for c in cases]
        self.assertEqual(len(ids), len(set(ids)))
        for cases in self.sets.values():
            self.assertEqual({c["language"] for c in cases}, set(m.LANGUAGES))

    def test_cases_are_the_workspace_file_with_one_line_masked(self):
        for cases in self.sets.values():
            for c in cases:
                text = self.workspaces[c["workspace"]][c["path"]]
                line = int(re.search(r" line (\d+) \(", c["source"]).group(1))
                lines = text.split("\n")
                masked = lines[line - 1]
                indent = masked[: len(masked) - len(masked.lstrip())]
                self.assertEqual(masked.rstrip(), indent + c["expected"], c["id"])
                self.assertTrue(c["prefix"].endswith(indent))
                before = "\n".join(lines[: line - 1]) + "\n"
                self.assertTrue(before.endswith(c["prefix"][: len(c["prefix"]) - len(indent)]))
                after = "\n" + "\n".join(lines[line:])
                self.assertTrue(after.startswith(c["suffix"]), c["id"])
                self.assertLessEqual(len(c["prefix"].encode()) - len(indent.encode()),
                                     m.PREFIX_BYTES)
                self.assertLessEqual(len(c["suffix"].encode()) - 1, m.SUFFIX_BYTES)
                self.assertEqual(c["file_name"], c["path"].rsplit("/", 1)[-1])
                self.assertTrue(c["expected"])

    def test_the_file_does_not_reveal_the_symbol(self):
        for cases in self.sets.values():
            for c in cases:
                files = self.workspaces[c["workspace"]]
                text = files[c["path"]]
                self.assertTrue(c["cross_file"], c["id"])
                for sym in c["cross_file"]:
                    name = sym["symbol"]
                    word = re.compile(r"(?<![A-Za-z0-9_$])" + re.escape(name) +
                                      r"(?![A-Za-z0-9_$])")
                    self.assertEqual(len(word.findall(text)),
                                     len(word.findall(c["expected"])), (c["id"], name))
                    self.assertGreater(len(word.findall(c["expected"])), 0)
                    for path in sym["defined_in"]:
                        self.assertNotEqual(path, c["path"])
                        self.assertRegex(files[path], word, (c["id"], path))

    def test_regenerates_byte_for_byte(self):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            m.build_cases(HERE / "repos", tmp)
            for name, _ in m.SPLITS.values():
                self.assertEqual((Path(tmp) / name).read_bytes(),
                                 lzma.decompress((HERE / (name + ".xz")).read_bytes()), name)


if __name__ == "__main__":
    unittest.main()
