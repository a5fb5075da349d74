//! `laya serve`: one resident process, one copy of each model's weights, for every editor
//! and tool on the machine.
//!
//! - `server`: the [`Daemon`] (a [`ModelPool`](crate::engine::pool::ModelPool), fair queueing,
//!   limits, status), the unix-socket server and start-up ([`run`]).
//! - `protocol`: the socket's JSON-lines messages.
//! - `http`: the HTTP API (`/complete`, `/v1/completions`, `/v1/models`, `/health`).
//! - `queue`: round-robin queueing across clients, per model.
//! - `client`: [`DaemonEngine`], the engine `laya lsp` uses; starts the daemon when needed.
//! - `paths`: the private runtime directory and the files in it.
//!
//! Its settings come from [`ServeConfig`](crate::config::ServeConfig).

pub mod client;
pub mod http;
pub mod paths;
pub mod protocol;
pub mod queue;
pub mod server;

pub use client::{ClientConfig, DaemonEngine, SpawnCommand};
pub use server::{run, Daemon, DaemonConfig, DaemonError, Defaults, Limits, ServeError};
