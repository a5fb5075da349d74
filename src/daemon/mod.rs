//! `laya serve`: one resident process, one copy of each model's weights, for every editor
//! and tool on the machine.
//!
//! - `server`: the [`Daemon`] (a [`ModelPool`](crate::engine::pool::ModelPool), fair queueing,
//!   limits, status), the unix-socket server and start-up ([`run`]).
//! - `protocol`: the socket's JSON-lines messages, one connection per request.
//! - `http`: the HTTP API (`/complete`, `/v1/completions`, `/v1/models`, `/health`).
//! - `queue`: round-robin queueing across clients, per model.
//! - `client`: [`DaemonEngine`], the engine `laya lsp` uses; starts the daemon when needed.
//! - `paths`: the private runtime directory and the files in it.
//!
//! Its settings come from [`ServeConfig`](crate::config::ServeConfig).
//!
//! Invariants: client requests never panic the daemon; one daemon per runtime directory (an
//! exclusive `flock` on `laya.lock`; a second exits with status 3); the directory is the
//! user's own and no one else may write it, the socket is mode 0600; HTTP binds loopback
//! unless `--http-addr` says otherwise, which then needs `--token-env` or
//! `--allow-unauthenticated-remote`; a request whose client is gone stops (leaves the queue,
//! is skipped by a loading model, or runs at most one more prompt chunk or decode step) and
//! the status counts it `abandoned`.

pub mod client;
pub mod http;
pub mod paths;
pub mod protocol;
pub mod queue;
pub mod server;

pub use client::{ClientConfig, DaemonEngine, SpawnCommand};
pub use server::{run, Daemon, DaemonConfig, DaemonError, Defaults, Limits, ServeError};
