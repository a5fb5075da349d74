//! laya: local-first code completion. See ARCHITECTURE.md for the module map.

pub mod bench;
pub mod catalog;
pub mod complete;
pub mod completion;
pub mod config;
pub mod daemon;
pub mod doctor;
pub mod document;
pub mod fetch;
pub mod lsp;
pub mod machine;
pub mod prompt;
pub mod service;
pub mod syntax;
pub mod workspace;

/// The inference engine (`crates/laya-engine`), under the name the modules here use.
pub use laya_engine as engine;
pub use laya_engine::{paths, testing};
