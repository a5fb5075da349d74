//! Turning raw model output into what an editor should insert.

pub mod lead;
pub mod pipeline;
pub mod postprocess;
pub mod router;
