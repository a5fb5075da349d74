//! The workspace index: the definitions of every source file under the workspace folders the
//! client declared, so that a prompt can show code from files that are not open.
//!
//! Boundary: paths and text in, definitions out; it knows nothing of LSP or engines. The LSP
//! layer builds it in the background and feeds it file events; the completion pipeline asks
//! [`retrieve()`] what to show. It also holds the one conversion of a `file://` URI into a path,
//! [`file_path`].
//!
//! Modules: `defs` (one file's definitions, by `queries/<lang>/definitions.scm`), `resolve`
//! (which files a file's imports name, per language), `retrieve` (what the prompt shows at a
//! cursor); this file holds the index, by file and by name ([`WorkspaceIndex`]).
//!
//! Invariants: nothing outside the roots is ever read (walks start at the roots, updates for
//! paths outside them are ignored, resolution keeps to the files the index holds; the
//! `security` tests list every file access); files that `.gitignore`/`.ignore` exclude, hidden
//! files and folders, and files over [`Limits::max_file_bytes`] are skipped; the index never
//! holds more than [`Limits::max_files`] files.

pub mod defs;
pub mod resolve;
pub mod retrieve;

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub use defs::{DefKind, Definition};
pub use retrieve::{retrieve, Retrieved};

use crate::syntax::Language;

/// Bounds on what the index reads and holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Most files indexed; files past it are left out (in walk order).
    pub max_files: usize,
    /// Files larger than this are skipped (generated or vendored code, data).
    pub max_file_bytes: u64,
    /// Definitions kept per file, in file order (generated bindings define thousands).
    pub max_definitions_per_file: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_files: 20_000,
            max_file_bytes: 256 * 1024,
            max_definitions_per_file: 1000,
        }
    }
}

/// One indexed file.
#[derive(Clone, Debug)]
pub struct FileEntry {
    pub language: Language,
    pub definitions: Vec<Definition>,
}

#[derive(Default)]
struct Data {
    files: HashMap<PathBuf, Arc<FileEntry>>,
    /// Definition name → the files defining it.
    by_name: HashMap<String, Vec<PathBuf>>,
}

impl Data {
    fn remove(&mut self, path: &Path) {
        if let Some(old) = self.files.remove(path) {
            for d in &old.definitions {
                if let Some(paths) = self.by_name.get_mut(&d.name) {
                    paths.retain(|p| p != path);
                    if paths.is_empty() {
                        self.by_name.remove(&d.name);
                    }
                }
            }
        }
    }

    fn insert(&mut self, path: PathBuf, entry: FileEntry) {
        self.remove(&path);
        for d in &entry.definitions {
            let paths = self.by_name.entry(d.name.clone()).or_default();
            if paths.last() != Some(&path) {
                paths.push(path.clone());
            }
        }
        self.files.insert(path, Arc::new(entry));
    }
}

/// The local path a `file://` URI names: the one conversion of a document's or folder's URI
/// into a path (the workspace index, the LSP's workspace folders, the path a prompt shows).
/// The `url` crate parses the URI and percent-decodes its path (`%20` is a space, `%C3%A9`
/// an `é`; bytes that are no UTF-8 stay bytes); then `.` and `..` are resolved lexically, an
/// encoded `/` or `..` counting as what it spells, so the path holds no `..` (whoever checks
/// that it lies inside a folder sees where it really points).
/// `None` for other schemes, for a host other than `localhost`, and for what is not
/// `file://…` (`file:a.py` included).
pub fn file_path(uri: &str) -> Option<PathBuf> {
    if !uri.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("file://")) {
        return None;
    }
    let url = url::Url::parse(uri).ok()?;
    let decoded = url.to_file_path().ok()?;
    let mut out = PathBuf::from("/");
    for part in decoded.components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

/// What a build did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BuildStats {
    pub files: usize,
    pub definitions: usize,
    /// Files skipped for their size or for the file limit.
    pub skipped: usize,
    pub elapsed: Duration,
}

/// The definitions of a workspace's files, by file and by name.
pub struct WorkspaceIndex {
    roots: Vec<PathBuf>,
    limits: Limits,
    data: RwLock<Data>,
    /// Retrievals asked of it ([`retrieve()`]).
    retrievals: AtomicUsize,
}

impl WorkspaceIndex {
    /// An empty index over `roots` (made absolute and canonical where they exist).
    pub fn new(roots: Vec<PathBuf>, limits: Limits) -> Self {
        let roots = roots
            .into_iter()
            .map(|r| std::fs::canonicalize(&r).unwrap_or(r))
            .collect();
        WorkspaceIndex {
            roots,
            limits,
            data: RwLock::new(Data::default()),
            retrievals: AtomicUsize::new(0),
        }
    }

    /// How many retrievals were asked of the index.
    pub fn retrievals(&self) -> usize {
        self.retrievals.load(Ordering::Relaxed)
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// The root holding `path`, if any.
    pub fn root_of(&self, path: &Path) -> Option<&Path> {
        self.roots
            .iter()
            .find(|r| path.starts_with(r))
            .map(PathBuf::as_path)
    }

    /// `path` relative to its root (as shown to the model), else as given.
    pub fn relative<'a>(&self, path: &'a Path) -> &'a Path {
        self.root_of(path)
            .and_then(|r| path.strip_prefix(r).ok())
            .unwrap_or(path)
    }

    /// The source files under the roots that the index would read, in walk order: known
    /// languages only, ignore files honoured, hidden entries and large files skipped.
    pub fn files_to_index(&self) -> (Vec<PathBuf>, usize) {
        let mut files = vec![];
        let mut skipped = 0;
        for root in &self.roots {
            let walk = ignore::WalkBuilder::new(root)
                .hidden(true)
                .git_ignore(true)
                .git_exclude(true)
                .ignore(true)
                .require_git(false)
                .follow_links(false)
                .build();
            for entry in walk.flatten() {
                if !entry.file_type().is_some_and(|t| t.is_file()) {
                    continue;
                }
                let path = entry.into_path();
                if Language::from_path(&path.to_string_lossy()).is_none() {
                    continue;
                }
                let too_big = std::fs::metadata(&path).map_or(true, |m| m.len() > self.limits.max_file_bytes);
                if too_big || files.len() >= self.limits.max_files {
                    skipped += 1;
                    continue;
                }
                files.push(path);
            }
        }
        (files, skipped)
    }

    /// Read and index every file under the roots, on `threads` threads; `progress(done,
    /// total)` hears how far it is (from those threads). Files already indexed from an
    /// editor's text ([`update`](Self::update)) while the build ran keep that text.
    pub fn build(&self, threads: usize, progress: impl Fn(usize, usize) + Sync) -> BuildStats {
        let start = Instant::now();
        let (files, skipped) = self.files_to_index();
        let total = files.len();
        let next = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let results = Mutex::new(Vec::with_capacity(total));
        std::thread::scope(|s| {
            for _ in 0..threads.max(1) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(path) = files.get(i) else { break };
                    if let Some(entry) = read_entry(path, &self.limits) {
                        results
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((path.clone(), entry));
                    }
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if d % 64 == 0 || d == total {
                        progress(d, total);
                    }
                });
            }
        });
        let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut data = self.data.write().unwrap_or_else(|p| p.into_inner());
        let mut definitions = 0;
        for (path, entry) in results {
            if data.files.contains_key(&path) {
                continue;
            }
            definitions += entry.definitions.len();
            data.insert(path, entry);
        }
        BuildStats {
            files: data.files.len(),
            definitions,
            skipped,
            elapsed: start.elapsed(),
        }
    }

    /// Index `path` from `text` (an open document's, or the file as saved); ignored for
    /// paths outside the roots and for languages laya does not know.
    pub fn update(&self, path: &Path, text: &str) {
        if self.root_of(path).is_none() {
            return;
        }
        let Some(language) = Language::from_path(&path.to_string_lossy()) else {
            return;
        };
        if text.len() as u64 > self.limits.max_file_bytes {
            return self.remove(path);
        }
        let entry = FileEntry::new(language, text, &self.limits);
        let mut data = self.data.write().unwrap_or_else(|p| p.into_inner());
        if !data.files.contains_key(path) && data.files.len() >= self.limits.max_files {
            return;
        }
        data.insert(path.to_owned(), entry);
    }

    /// Read `path` from disk again (created or changed on disk); removed when it is gone.
    pub fn reload(&self, path: &Path) {
        if self.root_of(path).is_none() {
            return;
        }
        match std::fs::read_to_string(path) {
            Ok(text) => self.update(path, &text),
            Err(_) => self.remove(path),
        }
    }

    pub fn remove(&self, path: &Path) {
        self.data.write().unwrap_or_else(|p| p.into_inner()).remove(path);
    }

    /// The files defining `name`.
    pub fn files_defining(&self, name: &str) -> Vec<PathBuf> {
        let data = self.data.read().unwrap_or_else(|p| p.into_inner());
        data.by_name.get(name).cloned().unwrap_or_default()
    }

    /// One file's entry (shared, not copied).
    pub fn file(&self, path: &Path) -> Option<Arc<FileEntry>> {
        let data = self.data.read().unwrap_or_else(|p| p.into_inner());
        data.files.get(path).cloned()
    }

    /// Whether `path` is indexed.
    pub fn contains(&self, path: &Path) -> bool {
        let data = self.data.read().unwrap_or_else(|p| p.into_inner());
        data.files.contains_key(path)
    }

    /// Files and definitions held.
    pub fn size(&self) -> (usize, usize) {
        let data = self.data.read().unwrap_or_else(|p| p.into_inner());
        (
            data.files.len(),
            data.files.values().map(|f| f.definitions.len()).sum(),
        )
    }
}

fn read_entry(path: &Path, limits: &Limits) -> Option<FileEntry> {
    let language = Language::from_path(&path.to_string_lossy())?;
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() as u64 > limits.max_file_bytes {
        return None;
    }
    let text = String::from_utf8(bytes).ok()?;
    Some(FileEntry::new(language, &text, limits))
}

impl FileEntry {
    /// The definitions of `text`, at most the limit's count (containers stay valid: a
    /// member never comes before its type).
    fn new(language: Language, text: &str, limits: &Limits) -> FileEntry {
        let mut definitions = defs::extract(language, text);
        definitions.truncate(limits.max_definitions_per_file);
        definitions.shrink_to_fit();
        FileEntry {
            language,
            definitions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace on disk from `(path, text)` pairs.
    pub(crate) fn workspace(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn builds_from_the_roots_honouring_ignore_files_hidden_entries_and_size() {
        let big = format!("def big():\n    pass\n{}", "# x\n".repeat(100_000));
        let dir = workspace(&[
            (
                "pkg/models.py",
                "class User:\n    def save(self):\n        pass\n",
            ),
            ("pkg/util.py", "def slugify(s):\n    return s\n"),
            ("build/gen.py", "def generated():\n    pass\n"),
            (".gitignore", "build/\n"),
            (".hidden/secret.py", "def secret():\n    pass\n"),
            ("vendor/big.py", &big),
            ("notes.txt", "def not_code(): pass\n"),
            (
                "web/app.ts",
                "export function render(x: number): string { return '' }\n",
            ),
        ]);
        let outside = workspace(&[("other.py", "def outside():\n    pass\n")]);
        let index = WorkspaceIndex::new(vec![dir.path().to_owned()], Limits::default());
        let stats = index.build(2, |_, _| {});
        assert_eq!(stats.files, 3, "{stats:?}");
        assert_eq!(stats.skipped, 1, "the large file");
        let root = index.roots()[0].clone();
        assert_eq!(index.files_defining("User"), [root.join("pkg/models.py")]);
        assert_eq!(index.files_defining("render"), [root.join("web/app.ts")]);
        for name in ["generated", "secret", "big", "not_code", "outside"] {
            assert!(index.files_defining(name).is_empty(), "{name}");
        }
        // Updates outside the roots are ignored.
        index.update(&outside.path().join("other.py"), "def outside():\n    pass\n");
        assert!(index.files_defining("outside").is_empty());
    }

    #[test]
    fn file_uris_become_paths() {
        assert_eq!(
            file_path("file:///a/b%20c/../d.py"),
            Some(PathBuf::from("/a/d.py"))
        );
        assert_eq!(file_path("file://host/a.py"), None);
        assert_eq!(file_path("untitled:Untitled-1"), None);
        assert_eq!(file_path("/a/b.py"), None, "a path is no URI");
        assert_eq!(file_path("file:a.py"), None);
    }

    /// Spaces and non-ASCII characters are percent-encoded in a URI and decoded in its path;
    /// an encoded `/` or `..` counts as what it spells and is resolved.
    #[test]
    fn file_uris_are_percent_decoded() {
        assert_eq!(
            file_path("file:///tmp/my%20dir/caf%C3%A9.rs"),
            Some(PathBuf::from("/tmp/my dir/café.rs"))
        );
        assert_eq!(
            file_path("file:///tmp/caf%c3%a9/%E6%97%A5%E6%9C%AC.py?x=1#frag"),
            Some(PathBuf::from("/tmp/café/日本.py")),
            "lower-case escapes; no query or fragment"
        );
        assert_eq!(
            file_path("file://localhost/tmp/a%23b.py"),
            Some(PathBuf::from("/tmp/a#b.py"))
        );
        assert_eq!(
            file_path("file:///work/demo/src/..%2F..%2F..%2Fetc/passwd"),
            Some(PathBuf::from("/etc/passwd"))
        );
        assert_eq!(
            file_path("file:///work/%2E%2E/%2e%2e/../x.py"),
            Some(PathBuf::from("/x.py"))
        );
    }

    #[test]
    fn updates_replace_a_files_definitions_and_removals_drop_them() {
        let dir = workspace(&[("a.py", "def old():\n    pass\n")]);
        let index = WorkspaceIndex::new(vec![dir.path().to_owned()], Limits::default());
        index.build(1, |_, _| {});
        let a = index.roots()[0].join("a.py");
        assert_eq!(index.files_defining("old"), std::slice::from_ref(&a));
        index.update(&a, "def new():\n    pass\n");
        assert!(index.files_defining("old").is_empty());
        assert_eq!(index.files_defining("new"), std::slice::from_ref(&a));
        // A file created on disk, then deleted.
        let b = index.roots()[0].join("b.py");
        std::fs::write(&b, "class B:\n    pass\n").unwrap();
        index.reload(&b);
        assert_eq!(index.files_defining("B"), std::slice::from_ref(&b));
        std::fs::remove_file(&b).unwrap();
        index.reload(&b);
        assert!(index.files_defining("B").is_empty());
        assert_eq!(index.size().0, 1);
    }

    #[test]
    fn the_file_limit_bounds_what_is_held() {
        let files: Vec<(String, String)> = (0..10)
            .map(|i| (format!("m{i}.py"), format!("def f{i}():\n    pass\n")))
            .collect();
        let refs: Vec<(&str, &str)> = files.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let dir = workspace(&refs);
        let index = WorkspaceIndex::new(
            vec![dir.path().to_owned()],
            Limits {
                max_files: 4,
                ..Limits::default()
            },
        );
        let stats = index.build(2, |_, _| {});
        assert_eq!((stats.files, stats.skipped), (4, 6));
        index.update(&index.roots()[0].join("new.py"), "def g():\n    pass\n");
        assert_eq!(index.size().0, 4, "no file past the limit");
    }
}
