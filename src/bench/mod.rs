//! `laya bench …`: benchmarks that print numbers. Speed claims are checked here, not in tests.

pub mod engine;
pub mod quality;
pub mod soak;
pub mod typing;
