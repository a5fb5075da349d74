#!/usr/bin/env python3
"""Checks editors/zed/extension.toml against the fields Zed's ExtensionManifest reads
(crates/extension/src/extension_manifest.rs) and the crate beside it.

    python3 editors/zed/test_manifest.py -v
"""

import tomllib
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST_KEYS = {
    "id", "name", "version", "schema_version", "description", "repository", "authors", "lib",
    "themes", "icon_themes", "languages", "grammars", "language_servers", "context_servers",
    "agent_servers", "slash_commands", "snippets", "capabilities", "debug_adapters",
    "debug_locators",
}
SERVER_KEYS = {"language", "languages", "language_ids", "code_action_kinds"}
# Zed's names for the languages laya completes (src/syntax/languages.rs).
LANGUAGES = {"Python", "Rust", "TypeScript", "TSX", "JavaScript", "Go", "C", "C++", "Java"}


class ZedManifest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(HERE / "extension.toml", "rb") as f:
            cls.m = tomllib.load(f)
        with open(HERE / "Cargo.toml", "rb") as f:
            cls.cargo = tomllib.load(f)

    def test_required_fields(self):
        self.assertLessEqual(set(self.m), MANIFEST_KEYS)
        for key in ("id", "name", "version"):
            self.assertIsInstance(self.m[key], str)
        self.assertEqual(self.m["schema_version"], 1)
        self.assertEqual(self.m["id"], "laya")

    def test_language_server(self):
        servers = self.m["language_servers"]
        self.assertEqual(set(servers), {"laya"}, "the server name the crate's settings use")
        laya = servers["laya"]
        self.assertLessEqual(set(laya), SERVER_KEYS | {"name"})
        self.assertEqual(set(laya["languages"]), LANGUAGES)

    def test_crate(self):
        self.assertIn("workspace", self.cargo, "a workspace of its own, outside laya's")
        self.assertIn("cdylib", self.cargo["lib"]["crate-type"])
        self.assertIn("zed_extension_api", self.cargo["dependencies"])
        self.assertEqual(self.cargo["package"]["version"], self.m["version"])
        src = (HERE / "src/lib.rs").read_text()
        self.assertIn('pub const SERVER: &str = "laya";', src)
        self.assertIn("register_extension!", src)


if __name__ == "__main__":
    unittest.main()
