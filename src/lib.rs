//! laya: local-first code completion. See ARCHITECTURE.md for the module map.

pub mod bench;
pub mod catalog;
pub mod complete;
pub mod completion;
pub mod config;
pub mod daemon;
pub mod doctor;
pub mod document;
pub mod engine;
pub mod fetch;
pub mod lsp;
pub mod machine;
pub mod prompt;
pub mod service;
pub mod syntax;
pub mod workspace;

pub use engine::{paths, testing};
