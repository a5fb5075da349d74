//! The completion pipeline of one keystroke: *plan* (context → route → the routed model's
//! budget → prompt), the engine call, *finish* (rank → post-process → remember). Knows no LSP
//! types; sees the engine only through the `Engine` trait.
//!
//! Modules: `pipeline` (the two steps, and what a document keeps between requests: the shown
//! suggestion, the anchor, the last `Explanation` for `laya/explain`), `router` (which model
//! answers, and why), `lead` (the syntax context as the prompt's local parts),
//! `postprocess` (the rules applied to a generated middle).
//!
//! An automatic request asks for the rest of the line unless the cursor starts an empty block
//! (`Surroundings::starts_empty_block`); an invoked one asks for a block unless it is mid-line.
//! A request outside an editor's session (HTTP `/complete`, `laya complete`) takes the same
//! plan and post-processing (`Pipeline::plan_once`, `Pipeline::finish_once`) and keeps
//! nothing of the document.
//!
//! Invariant: a prompt continued from the document's anchor equals the anchor's prompt plus
//! the text typed at its cursor, so the engine's prefix store reuses all but the new tokens.
//!
//! Start with `Pipeline::complete` in `pipeline.rs`.

pub mod lead;
pub mod pipeline;
pub mod postprocess;
pub mod router;
