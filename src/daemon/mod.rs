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
//!
//! ## How it works
//!
//! `laya serve`, the resident daemon: one process and one copy of each model for every editor
//! and tool. `server.rs` holds the `Daemon` (a `ModelPool`, request limits, status) and start-up:
//! a private runtime directory (`paths.rs`: `$XDG_RUNTIME_DIR/laya` or `/tmp/laya-$UID`, mode
//! 0700, owned by the user; one that others may write, a link, or another user's is refused), an exclusive `flock` on `laya.lock` (one daemon per directory; a
//! second exits with status 3), then the socket `laya.sock` (mode 0600; a stale one is replaced),
//! `laya.pid` and `http.addr`. `protocol.rs` is the socket protocol: one connection per request,
//! one JSON line in (`status` or `complete`), JSON lines out (`piece`…, then `done` or `error`);
//! closing the connection cancels (the daemon reads the connection while the request waits and
//! runs, so it notices at once). `queue.rs` queues per model and takes waiters round-robin
//! across clients (a local model runs one request at a time, a remote tier `--remote-parallel`);
//! a waiter whose client left drops out of line. `http.rs` (axum) serves `/complete`,
//! `/v1/completions` (OpenAI, SSE streaming), `/v1/models` and `/health`, with JSON errors and a
//! 4xx for what the client can fix (bad JSON, body size, `max_tokens`, `n`, content type), an
//! optional bearer token (compared in constant time, on every endpoint), and a loopback `Host`
//! check. HTTP binds loopback by default; a non-loopback `--http-addr` needs `--token-env` or
//! an explicit `--allow-unauthenticated-remote`. `client.rs` is `DaemonEngine`, the engine of
//! `laya lsp`: it starts a detached `laya serve` with the flags of the editor's `ServeConfig`
//! when none answers, waits for its socket, and starts a new one when a request finds it dead.
//! The daemon's settings come from `config::ServeConfig` (`daemon_config()`). Invariants:
//! requests from clients never panic the
//! daemon; a request whose client is gone stops (leaves the queue, is skipped by a loading
//! model, or runs at most one more prompt chunk or decode step), and the status counts it
//! `abandoned`.

pub mod client;
pub mod http;
pub mod paths;
pub mod protocol;
pub mod queue;
pub mod server;

pub use client::{ClientConfig, DaemonEngine, SpawnCommand};
pub use server::{run, Daemon, DaemonConfig, DaemonError, Defaults, Limits, ServeError};
