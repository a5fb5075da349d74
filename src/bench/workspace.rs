//! `laya bench workspace DIR`: how long the workspace index takes to build over a folder, what
//! it holds, and how long retrieval takes at cursors spread over its files.

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use crate::document::Document;
use crate::syntax::Language;
use crate::workspace::{retrieve, BuildStats, Limits, WorkspaceIndex};

use super::percentile;

pub struct Config {
    /// The workspace folder.
    pub dir: PathBuf,
    /// Threads building the index.
    pub threads: usize,
    /// Cursors to retrieve at (spread over the indexed files).
    pub samples: usize,
    /// Snippet budget per retrieval, bytes.
    pub max_bytes: usize,
}

#[derive(Debug)]
pub struct Report {
    pub build: BuildStats,
    /// Bytes of definition text held (names and signatures).
    pub held_bytes: usize,
    /// Retrieval times, ms.
    pub retrieve_ms: Vec<f64>,
    /// Retrievals that returned at least one snippet.
    pub with_snippets: usize,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.build;
        writeln!(
            f,
            "index: {} files, {} definitions ({:.1} MB of names and signatures), {} skipped; built in {:.2} s",
            b.files,
            b.definitions,
            self.held_bytes as f64 / 1e6,
            b.skipped,
            b.elapsed.as_secs_f64()
        )?;
        writeln!(
            f,
            "retrieval at {} cursors: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {} with snippets",
            self.retrieve_ms.len(),
            percentile(&self.retrieve_ms, 50.0),
            percentile(&self.retrieve_ms, 99.0),
            self.retrieve_ms.iter().cloned().fold(0.0, f64::max),
            self.with_snippets
        )
    }
}

pub fn run(cfg: &Config, log: impl Fn(&str) + Sync) -> Result<Report, String> {
    if !cfg.dir.is_dir() {
        return Err(format!("{}: not a folder", cfg.dir.display()));
    }
    let index = WorkspaceIndex::new(vec![cfg.dir.clone()], Limits::default());
    let build = index.build(cfg.threads, |done, total| {
        if done == total || done % 1024 == 0 {
            log(&format!("indexed {done}/{total} files"));
        }
    });
    let (files, _) = index.files_to_index();
    let held_bytes = files
        .iter()
        .filter_map(|p| index.file(p))
        .map(|f| {
            f.definitions
                .iter()
                .map(|d| d.name.len() + d.signature.len())
                .sum::<usize>()
        })
        .sum();
    let mut retrieve_ms = vec![];
    let mut with_snippets = 0;
    let step = (files.len() / cfg.samples.max(1)).max(1);
    for path in files.iter().step_by(step).take(cfg.samples) {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let Some(language) = Language::from_path(&path.to_string_lossy()) else {
            continue;
        };
        // A cursor two thirds down the file, at a line start.
        let two_thirds = crate::syntax::context::floor_char_boundary(&text, text.len() * 2 / 3);
        let cursor = text[..two_thirds].rfind('\n').map_or(0, |i| i + 1);
        // The imports as the pipeline reads them (the syntax layer's `@import` captures).
        let language_id = language.config().language_ids[0];
        let doc = Document::new(&text, 1, language_id).snapshot(&format!("file://{}", path.display()));
        let imports = doc.context(cursor, &[]).map(|c| c.imports).unwrap_or_default();
        let t = Instant::now();
        let r = retrieve(&index, path, language, &text, cursor, &imports, cfg.max_bytes);
        retrieve_ms.push(t.elapsed().as_secs_f64() * 1e3);
        with_snippets += usize::from(!r.snippets.is_empty());
    }
    Ok(Report {
        build,
        held_bytes,
        retrieve_ms,
        with_snippets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file whose two-thirds point falls inside a character (generated tables of Unicode
    /// names are common in crates) is measured, not a panic.
    #[test]
    fn a_cursor_is_placed_in_files_of_any_characters() {
        let dir = tempfile::tempdir().unwrap();
        // 2 + 4·4 + 1 bytes: two thirds of 19 is byte 12, inside the third four-byte character.
        std::fs::write(dir.path().join("names.rs"), "//𑌓𑌓𑌓𑌓\n").unwrap();
        std::fs::write(dir.path().join("lib.rs"), "fn used() {}\n").unwrap();
        let cfg = Config {
            dir: dir.path().to_owned(),
            threads: 1,
            samples: 10,
            max_bytes: 1024,
        };
        let report = run(&cfg, |_| {}).unwrap();
        assert_eq!(report.retrieve_ms.len(), 2);
    }
}
