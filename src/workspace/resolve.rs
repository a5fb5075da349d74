//! Which files of the workspace a file's imports name, per language: Python modules and
//! packages (absolute and relative), TypeScript/JavaScript relative imports and index files,
//! Rust `use crate::`/`super::`/`self::` paths and `mod` declarations, Go package
//! directories (through `go.mod`'s module path), C/C++ local includes and Java packages.
//! Only files the index holds are returned, so nothing outside the workspace comes back.

use std::path::{Component, Path, PathBuf};

use super::WorkspaceIndex;
use crate::syntax::Language;

/// The indexed files that the import statements `imports` (their source text) of the file at
/// `path` refer to, in import order, without repeats.
pub fn imported_files(
    index: &WorkspaceIndex,
    language: Language,
    path: &Path,
    imports: &[String],
) -> Vec<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new(""));
    let root = index
        .root_of(path)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dir.to_owned());
    let mut out: Vec<PathBuf> = vec![];
    let mut add = |p: PathBuf| {
        let p = normalize(&p);
        if index.contains(&p) && !out.contains(&p) && p != path {
            out.push(p);
        }
    };
    for statement in imports {
        for candidate in candidates(index, language.name(), path, dir, &root, statement) {
            add(candidate);
        }
    }
    out
}

/// The files an import statement may mean, most likely first (unchecked).
fn candidates(
    index: &WorkspaceIndex,
    language: &str,
    path: &Path,
    dir: &Path,
    root: &Path,
    statement: &str,
) -> Vec<PathBuf> {
    match language {
        "python" => python(dir, root, path, statement),
        "typescript" | "tsx" | "javascript" => script(dir, statement),
        "rust" => rust(root, path, statement),
        "go" => go(index, root, dir, statement),
        "c" | "cpp" => include(dir, root, statement),
        "java" => java(index, root, dir, statement),
        _ => vec![],
    }
}

/// `a/./b/../c` → `a/c`, without touching the disk.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn python_module(base: &Path, dotted: &str) -> Vec<PathBuf> {
    let rel: PathBuf = dotted.split('.').filter(|s| !s.is_empty()).collect();
    vec![
        base.join(&rel).with_extension("py"),
        base.join(&rel).join("__init__.py"),
        base.join(&rel).with_extension("pyi"),
    ]
}

fn python(dir: &Path, root: &Path, path: &Path, statement: &str) -> Vec<PathBuf> {
    let s = statement.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = vec![];
    // Absolute modules resolve from the root and from each folder above the file (a
    // `src/` layout or a package inside the workspace).
    let mut bases: Vec<PathBuf> = path
        .ancestors()
        .skip(1)
        .take_while(|a| a.starts_with(root))
        .map(Path::to_path_buf)
        .collect();
    if bases.is_empty() {
        bases.push(root.to_owned());
    }
    if let Some(rest) = s.strip_prefix("from ") {
        let (module, names) = rest.split_once(" import ").unwrap_or((rest, ""));
        let dots = module.chars().take_while(|&c| c == '.').count();
        let module = &module[dots..];
        let names: Vec<&str> = names
            .trim_matches(|c| c == '(' || c == ')')
            .split(',')
            .map(|n| n.split(" as ").next().unwrap_or("").trim())
            .filter(|n| !n.is_empty() && *n != "*")
            .collect();
        let bases: Vec<PathBuf> = if dots > 0 {
            let mut base = dir.to_owned();
            for _ in 1..dots {
                base.pop();
            }
            vec![base]
        } else {
            bases
        };
        for base in &bases {
            out.extend(python_module(base, module));
            // `from pkg import module`: the names may be modules of the package.
            for n in &names {
                out.extend(python_module(base, &format!("{module}.{n}")));
            }
        }
    } else if let Some(rest) = s.strip_prefix("import ") {
        for m in rest.split(',') {
            let m = m.split(" as ").next().unwrap_or("").trim();
            for base in &bases {
                out.extend(python_module(base, m));
            }
        }
    }
    out
}

/// The quoted module of a statement: `import x from './a'`, `require("./b")`, `#include "c.h"`.
fn quoted(statement: &str) -> Option<&str> {
    let start = statement.find(['"', '\''])?;
    let quote = statement[start..].chars().next()?;
    let rest = &statement[start + 1..];
    Some(&rest[..rest.find(quote)?])
}

fn script(dir: &Path, statement: &str) -> Vec<PathBuf> {
    let Some(module) = quoted(statement) else {
        return vec![];
    };
    if !module.starts_with('.') {
        return vec![];
    }
    let base = dir.join(module);
    let mut out = vec![base.clone()];
    // `./x.js` written for a `./x.ts` source (TypeScript's ESM style).
    let stem = match base.extension().and_then(|e| e.to_str()) {
        Some("js" | "mjs" | "cjs" | "jsx") => base.with_extension(""),
        _ => base.clone(),
    };
    for ext in ["ts", "tsx", "js", "jsx", "mjs", "cjs", "d.ts"] {
        out.push(PathBuf::from(format!("{}.{ext}", stem.display())));
    }
    for ext in ["ts", "tsx", "js", "jsx"] {
        out.push(base.join(format!("index.{ext}")));
    }
    out
}

/// The folder of the module a Rust file defines: `src/a/b.rs` and `src/a/b/mod.rs` → `src/a/b`,
/// `src/lib.rs`/`src/main.rs`/`mod.rs` → their folder.
fn rust_module_dir(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("")).to_owned();
    match path.file_stem().and_then(|s| s.to_str()) {
        Some("lib" | "main" | "mod") | None => dir,
        Some(stem) => dir.join(stem),
    }
}

/// The crate root folder (`src/`) of a Rust file: the folder above it with a `Cargo.toml`'s
/// `src`, else the folder of the nearest `lib.rs`/`main.rs`.
fn rust_crate_src(root: &Path, path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .skip(1)
        .take_while(|a| a.starts_with(root))
        .find_map(|a| {
            if a.join("Cargo.toml").is_file() {
                Some(a.join("src"))
            } else if a.join("lib.rs").is_file() || a.join("main.rs").is_file() {
                Some(a.to_owned())
            } else {
                None
            }
        })
}

fn rust_module_files(base: &Path, segments: &[&str]) -> Vec<PathBuf> {
    // `a::b::Item`: a module `a/b` or an item of `a` (the last segments may be items).
    let mut out = vec![];
    for n in (1..=segments.len()).rev() {
        let rel: PathBuf = segments[..n].iter().collect();
        out.push(base.join(&rel).with_extension("rs"));
        out.push(base.join(&rel).join("mod.rs"));
    }
    out
}

fn rust(root: &Path, path: &Path, statement: &str) -> Vec<PathBuf> {
    let s: String = statement.split_whitespace().collect::<Vec<_>>().join(" ");
    let s = s.trim_end_matches(';');
    if let Some(name) = s.strip_prefix("mod ").or_else(|| s.strip_prefix("pub mod ")) {
        let base = rust_module_dir(path);
        return vec![base.join(format!("{name}.rs")), base.join(name).join("mod.rs")];
    }
    let Some(rest) = s
        .strip_prefix("use ")
        .or_else(|| s.split_once(" use ").map(|(_, r)| r))
    else {
        return vec![];
    };
    // Expand one level of braces: `crate::a::{b, c::D}` → `crate::a::b`, `crate::a::c::D`.
    let mut paths = vec![];
    match rest.split_once('{') {
        Some((head, tail)) => {
            for item in tail.trim_end_matches('}').split(',') {
                let item = item.trim().split(" as ").next().unwrap_or("").trim();
                if !item.is_empty() && !item.contains('{') {
                    paths.push(format!("{head}{item}"));
                }
            }
            paths.push(head.trim_end_matches("::").to_owned());
        }
        None => paths.push(rest.split(" as ").next().unwrap_or("").to_owned()),
    }
    let mut out = vec![];
    for p in paths {
        let segments: Vec<&str> = p
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "self" && *s != "*")
            .collect();
        let Some((&first, rest)) = segments.split_first() else {
            continue;
        };
        let base = match first {
            "crate" => rust_crate_src(root, path),
            "super" => {
                let mut b = rust_module_dir(path);
                b.pop();
                let mut rest_iter = rest;
                while let Some((&"super", r)) = rest_iter.split_first() {
                    b.pop();
                    rest_iter = r;
                }
                out.extend(rust_module_files(&b, rest_iter));
                continue;
            }
            _ => None,
        };
        if let Some(base) = base {
            out.extend(rust_module_files(&base, rest));
        } else if s.starts_with("use self::") || !segments.is_empty() {
            // `self::x` or a path relative to the current module.
            out.extend(rust_module_files(&rust_module_dir(path), &segments));
        }
    }
    out
}

/// Go: each quoted import path inside the module (`go.mod`'s `module` line) is a folder; every
/// `.go` file of it that the index holds.
fn go(index: &WorkspaceIndex, root: &Path, dir: &Path, statement: &str) -> Vec<PathBuf> {
    let Some((module_root, module)) = dir.ancestors().take_while(|a| a.starts_with(root)).find_map(|a| {
        let text = std::fs::read_to_string(a.join("go.mod")).ok()?;
        let m = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("module "))?
            .trim()
            .to_owned();
        Some((a.to_owned(), m))
    }) else {
        return vec![];
    };
    let mut out = vec![];
    for line in statement.lines() {
        let Some(import) = quoted(line) else { continue };
        let Some(rel) = import.strip_prefix(&module) else {
            continue;
        };
        let folder = module_root.join(rel.trim_start_matches('/'));
        out.extend(files_in(index, &folder, "go"));
    }
    out
}

/// The indexed files directly in `folder` with extension `ext`, sorted; nothing for a folder
/// outside the workspace (which is never listed).
fn files_in(index: &WorkspaceIndex, folder: &Path, ext: &str) -> Vec<PathBuf> {
    let folder = normalize(folder);
    if index.root_of(&folder).is_none() {
        return vec![];
    }
    let Ok(entries) = std::fs::read_dir(&folder) else {
        return vec![];
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some(ext) && index.contains(p))
        .filter(|p| !p.to_string_lossy().ends_with("_test.go"))
        .collect();
    files.sort();
    files
}

fn include(dir: &Path, root: &Path, statement: &str) -> Vec<PathBuf> {
    // Only `#include "local.h"`; `<system>` headers are not the workspace's.
    let Some(header) = quoted(statement) else {
        return vec![];
    };
    let mut out = vec![
        dir.join(header),
        root.join(header),
        root.join("include").join(header),
        root.join("src").join(header),
    ];
    // A header next to it that the include reaches through an include path.
    for a in dir.ancestors().skip(1).take_while(|a| a.starts_with(root)) {
        out.push(a.join("include").join(header));
    }
    out
}

/// Java: `import a.b.C;` → the file `a/b/C.java` under any source root; `import a.b.*;` and
/// the file's own package → the files of that folder.
fn java(index: &WorkspaceIndex, root: &Path, dir: &Path, statement: &str) -> Vec<PathBuf> {
    let s = statement.trim().trim_end_matches(';');
    let Some(name) = s.strip_prefix("import ") else {
        return vec![];
    };
    let name = name.trim().trim_start_matches("static ").trim();
    let parts: Vec<&str> = name.split('.').collect();
    // The source root: the folder above the file's package path (`src/main/java`).
    let source_roots: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|a| a.starts_with(root))
        .map(Path::to_path_buf)
        .collect();
    let mut out = vec![];
    for base in &source_roots {
        if parts.last() == Some(&"*") {
            let folder: PathBuf = parts[..parts.len() - 1].iter().collect();
            out.extend(files_in(index, &base.join(folder), "java"));
        } else {
            // `a.b.C` or, static, `a.b.C.member`.
            for n in (1..=parts.len()).rev() {
                let rel: PathBuf = parts[..n].iter().collect();
                out.push(base.join(rel).with_extension("java"));
            }
        }
    }
    out
}

/// The other files of the file's own folder that share its package (Go, Java): visible
/// without an import.
pub fn same_package(index: &WorkspaceIndex, language: Language, path: &Path) -> Vec<PathBuf> {
    let ext = match language.name() {
        "go" => "go",
        "java" => "java",
        _ => return vec![],
    };
    let dir = path.parent().unwrap_or(Path::new(""));
    files_in(index, dir, ext)
        .into_iter()
        .filter(|p| p != path)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::tests::workspace;
    use crate::workspace::Limits;

    fn resolved(files: &[(&str, &str)], current: &str, imports: &[&str]) -> Vec<String> {
        let dir = workspace(files);
        let index = WorkspaceIndex::new(vec![dir.path().to_owned()], Limits::default());
        index.build(1, |_, _| {});
        let root = index.roots()[0].clone();
        let path = root.join(current);
        let language = Language::from_path(current).unwrap();
        let imports: Vec<String> = imports.iter().map(|s| s.to_string()).collect();
        imported_files(&index, language, &path, &imports)
            .iter()
            .map(|p| p.strip_prefix(&root).unwrap().to_string_lossy().into_owned())
            .collect()
    }

    const PY: &str = "def f():\n    pass\n";

    #[test]
    fn python_absolute_relative_and_package_imports() {
        let files = [
            ("app/__init__.py", PY),
            ("app/models.py", PY),
            ("app/db/__init__.py", PY),
            ("app/db/session.py", PY),
            ("app/views.py", PY),
            ("lib/util.py", PY),
        ];
        assert_eq!(
            resolved(
                &files,
                "app/views.py",
                &[
                    "from .models import User",
                    "from .db import session",
                    "import lib.util",
                    "from ..lib import util",
                    "import os"
                ]
            ),
            [
                "app/models.py",
                "app/db/__init__.py",
                "app/db/session.py",
                "lib/util.py"
            ]
        );
        assert_eq!(
            resolved(
                &files,
                "app/db/session.py",
                &["from ..models import (\n    User,\n)"]
            ),
            ["app/models.py"]
        );
        assert_eq!(
            resolved(&files, "app/views.py", &["from app.db.session import get"]),
            ["app/db/session.py"]
        );
    }

    #[test]
    fn script_relative_imports_and_index_files() {
        let ts = "export function f() {}\n";
        let files = [
            ("src/a.ts", ts),
            ("src/util/index.ts", ts),
            ("src/b.tsx", ts),
            ("src/c.js", ts),
            ("src/main.ts", ts),
        ];
        assert_eq!(
            resolved(
                &files,
                "src/main.ts",
                &[
                    "import { f } from './a'",
                    "import * as u from \"./util\"",
                    "import B from './b.js'",
                    "const c = require('./c')",
                    "import x from 'react'"
                ]
            ),
            ["src/a.ts", "src/util/index.ts", "src/b.tsx", "src/c.js"]
        );
    }

    #[test]
    fn rust_crate_super_self_and_mod_paths() {
        let rs = "pub fn f() {}\n";
        let files = [
            ("Cargo.toml", "[package]\nname = \"x\"\n"),
            ("src/lib.rs", rs),
            ("src/config.rs", rs),
            ("src/net/mod.rs", rs),
            ("src/net/tcp.rs", rs),
            ("src/net/udp.rs", rs),
        ];
        assert_eq!(
            resolved(
                &files,
                "src/net/tcp.rs",
                &[
                    "use crate::config::Config;",
                    "use super::udp::{Socket, bind};",
                    "use std::io;"
                ]
            ),
            ["src/config.rs", "src/net/udp.rs"]
        );
        assert_eq!(
            resolved(&files, "src/lib.rs", &["mod config;", "pub mod net;"]),
            ["src/config.rs", "src/net/mod.rs"]
        );
        assert_eq!(
            resolved(&files, "src/net/mod.rs", &["use self::tcp::Stream;"]),
            ["src/net/tcp.rs"]
        );
    }

    #[test]
    fn go_package_folders_through_the_module_path() {
        let go = "package p\n\nfunc F() {}\n";
        let files = [
            ("go.mod", "module example.com/app\n\ngo 1.21\n"),
            ("internal/store/store.go", go),
            ("internal/store/cache.go", go),
            ("internal/store/store_test.go", go),
            ("cmd/main.go", go),
        ];
        assert_eq!(
            resolved(
                &files,
                "cmd/main.go",
                &["import (\n\t\"fmt\"\n\t\"example.com/app/internal/store\"\n)"]
            ),
            ["internal/store/cache.go", "internal/store/store.go"]
        );
    }

    #[test]
    fn c_local_includes_and_java_packages() {
        let c = "int f(void);\n";
        let files = [("src/conn.h", c), ("include/api.h", c), ("src/main.c", c)];
        assert_eq!(
            resolved(
                &files,
                "src/main.c",
                &["#include \"conn.h\"", "#include \"api.h\"", "#include <stdio.h>"]
            ),
            ["src/conn.h", "include/api.h"]
        );
        let j = "package a.b;\nclass X {}\n";
        let files = [
            ("src/main/java/a/b/Parser.java", j),
            ("src/main/java/a/b/Lexer.java", j),
            ("src/main/java/a/c/Node.java", j),
            ("src/main/java/a/c/Leaf.java", j),
            ("src/main/java/a/d/Util.java", j),
        ];
        assert_eq!(
            resolved(
                &files,
                "src/main/java/a/b/Parser.java",
                &[
                    "import a.c.Node;",
                    "import a.d.*;",
                    "import static a.c.Leaf.make;",
                    "import java.util.List;"
                ]
            ),
            [
                "src/main/java/a/c/Node.java",
                "src/main/java/a/d/Util.java",
                "src/main/java/a/c/Leaf.java"
            ]
        );
    }
}
