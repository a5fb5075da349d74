#!/usr/bin/env python3
"""Checks editors/helix/languages.toml: it parses as TOML and has the structure Helix reads.

Helix itself is not packaged where the tests run, so this checks the file against Helix's
documented `languages.toml` schema (book/src/languages.md) and against laya's own settings
(`CompletionSettings` in src/completion/pipeline.rs). When `hx` is on PATH it also runs
`hx --health` with the snippet as the user's configuration.

    python3 -m unittest editors/helix/test_languages.py
"""

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SNIPPET = HERE / "languages.toml"

# Helix's own languages.toml of its latest release, vendored (Helix is MPL-2.0; the file is
# unchanged from the tag 25.07.1, commit a05c151bb6e8e9c65ec390b0ae2afe7a5efd619b).
HELIX_VERSION = "25.07.1"
HELIX_LANGUAGES = HERE / "testdata" / f"helix-{HELIX_VERSION}-languages.toml"

# Helix's names for the languages laya completes (src/syntax/languages.rs).
LAYA_LANGUAGES = ["python", "rust", "typescript", "tsx", "javascript", "jsx", "go", "c", "cpp", "java"]


def helix_release():
    """(the language servers the release defines, each language's default server list)."""
    with open(HELIX_LANGUAGES, "rb") as f:
        doc = tomllib.load(f)
    defaults = {l["name"]: [s if isinstance(s, str) else s["name"] for s in l.get("language-servers", [])]
                for l in doc["language"]}
    return set(doc["language-server"]), defaults


HELIX_SERVERS, HELIX_LANGUAGE_SERVERS = helix_release()
HELIX_DEFAULTS = {name: HELIX_LANGUAGE_SERVERS[name] for name in LAYA_LANGUAGES}

# Keys Helix accepts (book/src/languages.md).
SERVER_KEYS = {"command", "args", "config", "timeout", "environment", "required-root-patterns"}
FEATURES = {
    "format", "goto-declaration", "goto-definition", "goto-type-definition", "goto-reference",
    "goto-implementation", "signature-help", "hover", "document-highlight", "completion",
    "code-action", "document-links", "workspace-command", "document-symbols",
    "workspace-symbols", "diagnostics", "rename-symbol", "inlay-hints", "document-colors",
}


def camel(name):
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def server_settings():
    """laya's `completion` settings: field name (camelCase) -> Rust type."""
    src = (ROOT / "src/completion/pipeline.rs").read_text()
    body = re.search(r"pub struct CompletionSettings \{(.*?)\n\}", src, re.S).group(1)
    return {camel(n): t.strip() for n, t in re.findall(r"pub (\w+):\s*([^,]+),", body)}


class HelixSnippet(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(SNIPPET, "rb") as f:
            cls.doc = tomllib.load(f)

    def test_top_level(self):
        self.assertLessEqual(set(self.doc), {"language", "language-server", "use-grammars"})
        self.assertIsInstance(self.doc["language"], list)
        self.assertIsInstance(self.doc["language-server"], dict)

    def test_laya_server(self):
        laya = self.doc["language-server"]["laya"]
        self.assertLessEqual(set(laya), SERVER_KEYS)
        self.assertIsInstance(laya["command"], str)
        self.assertTrue(laya["command"])
        self.assertIsInstance(laya["args"], list)
        self.assertTrue(all(isinstance(a, str) for a in laya["args"]))
        self.assertEqual(laya["args"][0], "lsp", "laya's language server is `laya lsp`")
        self.assertIsInstance(laya.get("timeout", 20), int)

    def test_settings_are_layas(self):
        settings = self.doc["language-server"]["laya"]["config"]
        self.assertEqual(set(settings), {"completion"})
        known = server_settings()
        self.assertTrue(known, "CompletionSettings not found in src/completion/pipeline.rs")
        for key, value in settings["completion"].items():
            self.assertIn(key, known, f"`{key}` is not one of laya's settings {sorted(known)}")
            rust = known[key]
            if rust in ("u64", "usize", "u32"):
                self.assertIsInstance(value, int, key)
                self.assertNotIsInstance(value, bool, key)
            elif rust in ("f32", "f64"):
                self.assertIsInstance(value, (int, float), key)
            elif rust.startswith("Vec<"):
                self.assertIsInstance(value, list, key)
            elif rust == "bool":
                self.assertIsInstance(value, bool, key)

    def test_languages_wired_to_laya(self):
        names = [lang["name"] for lang in self.doc["language"]]
        self.assertEqual(len(names), len(set(names)), "a language is listed twice")
        self.assertEqual(set(names), set(HELIX_DEFAULTS), "every language laya knows, no other")
        defined = set(self.doc["language-server"])
        for lang in self.doc["language"]:
            with self.subTest(language=lang["name"]):
                self.assertLessEqual(set(lang), {"name", "language-servers"})
                servers = lang["language-servers"]
                names = []
                for s in servers:
                    if isinstance(s, str):
                        names.append(s)
                        continue
                    self.assertIsInstance(s, dict)
                    self.assertLessEqual(set(s), {"name", "only-features", "except-features"})
                    self.assertFalse("only-features" in s and "except-features" in s)
                    for key in ("only-features", "except-features"):
                        self.assertLessEqual(set(s.get(key, [])), FEATURES)
                    names.append(s["name"])
                self.assertIn("laya", names)
                laya = next(s for s in servers if isinstance(s, dict) and s["name"] == "laya")
                self.assertEqual(laya.get("only-features"), ["completion"])
                # Helix's own servers stay (the list replaces Helix's default one).
                self.assertEqual([n for n in names if n != "laya"], HELIX_DEFAULTS[lang["name"]])
                # Every name is a server the released Helix defines, or the snippet's own:
                # Helix logs an error for an undefined one at every start.
                for n in names:
                    self.assertTrue(
                        n in defined or n in HELIX_SERVERS,
                        f"`{n}` is not a language server Helix {HELIX_VERSION} defines",
                    )

    def test_vendored_release_is_the_one_named(self):
        text = HELIX_LANGUAGES.read_text()
        self.assertTrue(text.startswith("# Language support configuration."), HELIX_LANGUAGES)
        self.assertIn("python", HELIX_LANGUAGE_SERVERS)
        self.assertNotIn("zuban", HELIX_SERVERS, "25.07.1 does not define zuban")

    @unittest.skipUnless(shutil.which("hx"), "hx (Helix) is not installed")
    def test_helix_health(self):
        with tempfile.TemporaryDirectory() as home:
            cfg = Path(home, "helix")
            cfg.mkdir()
            shutil.copy(SNIPPET, cfg / "languages.toml")
            out = subprocess.run(
                ["hx", "--health", "python"],
                env={**os.environ, "XDG_CONFIG_HOME": home},
                capture_output=True,
                text=True,
                timeout=60,
            )
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("laya", out.stdout)


if __name__ == "__main__":
    unittest.main()
