//! laya's integration tests: one test binary, one module per subject, and `support` for
//! what they share (the MLX lock and the CPU classes, the fake engine, the OpenAI-compatible
//! stub, the LSP clients, `laya` processes, the tiny GGUF).
//!
//! `cargo test --release --locked --test it` runs them all; `--test it lsp_transport::` one
//! module; `--test it NAME` the tests whose path contains NAME.
//!
//! ## How it works
//!
//! Integration tests, one test binary: `tests/it/main.rs` declares a module per file below
//! (`cargo test --test it lsp_server::` runs one). The engine's own tests (the MLX ops, loading
//! broken files and safetensors folders, agreement with llama.cpp) live in the engine crate,
//! `crates/laya-engine/src/tests/` (`cargo test -p laya-engine`). A plain `cargo test` needs no
//! downloaded model and no llama.cpp venv: what does not depend on the real weights (serving end
//! to end, the daemon, the CLI, the soak) runs on tiny models the tests write (the engine's
//! `synthetic::gguf`, as `support::gguf`), and the tests of the real models' own outputs and of
//! llama.cpp (`remote_llama_cpp.rs`, the real-model runs in `daemon.rs` and `cli.rs`) run with
//! `LAYA_TEST_REAL_MODELS=1` (`crates/laya-engine/src/testing.rs`), which `scripts/test.sh`, and
//! so CI, sets. `lsp_server.rs` drives the LSP server in-process through
//! `tower::Service` with `$0` fixtures and a deterministic fake engine (lifecycle, encodings,
//! cancellation, requests during a model's load and the progress beside them, malformed messages, settings, repo-level prompts).
//! `daemon.rs` runs `laya serve` and `laya lsp` as
//! processes against a stub OpenAI server written in the test (HTTP shapes and errors, the private
//! and stale socket, one daemon shared by two language servers and restarted after a kill, fair
//! queueing and cancellation), plus a run over HTTP end to end on the tiny GGUF (and on the real
//! 0.5B), two starts on a folder converted at load (`/health` and `laya doctor` say the second
//! read the converted cache), the daemon in-process with tiny models whose loads the test
//! holds (the small model answers for the large one while it loads), and the daemon in-process on
//! a stub beside the LSP server in-process on the same pool (`/complete` answers the text an
//! editor is shown at the same cursor); `faults.rs` breaks
//! things on purpose (missing, truncated and corrupt weights, a daemon killed mid-request, a killed
//! daemon's files, a full disk under the converted cache, clients that vanish mid-stream: see
//! docs/reliability.md) on a tiny GGUF the test writes; `service.rs` installs
//! and removes the service files under a temporary HOME. `soak.rs` runs a short `laya bench soak`
//! (LSP and HTTP clients, tiny random model): nothing lost or answered twice, memory flat once
//! the prefix store is full. `security.rs`: loopback by default, the private runtime directory,
//! the token on every endpoint, request limits (HTTP and socket), and source scans that keep file
//! access and process starts to reviewed sites. `fuzz_lsp.rs`: 100k generated messages through
//! the real stdio transport (framing faults, odd ids, wrong params; each fault answered and the
//! connection going on, one response per request, no panic) and 10k random `didChange` edits
//! whose result must equal a string model's. `daemon.rs` also runs `laya lsp` on a cold daemon it starts itself (the real 0.5B, with the switch): the first
//! request after `initialized` waits for the load with `$/progress` and is answered, one cancelled
//! meanwhile is answered before the load ends. `lsp_transport.rs`: every kind of malformed message,
//! over in-memory pipes and on a built `laya lsp`'s stdio, each followed by a request on the same
//! connection that must get its answer; `exit` and the end of the input end the connection and
//! the process within a second in every state (not initialized, a completion in flight, a model
//! loading, a daemon starting). `stale_work.rs`: `laya serve` on the tiny GGUF with clients that
//! leave mid-prefill and mid-decode (socket, HTTP streamed and not, `$/cancelRequest`, a newer
//! request, a killed or closed `laya lsp`, a request waiting in line): at most one more chunk or
//! step runs after the daemon's status shows the request abandoned, and the next request is
//! answered.
//! `remote_llama_cpp.rs` starts a real llama.cpp server (`llama_cpp.server` from
//! `scripts/peer-setup.sh`'s venv, the 1.5B GGUF) on loopback: `laya serve --large-remote` must
//! answer `/v1/completions` and `/complete` with llama.cpp's own greedy text for the same prompt,
//! and `laya lsp --remote-url` must complete from its answer.
//! `fetch_hub.rs` runs `laya models fetch`'s hub path against a hub on loopback
//! (`support/hub.rs`: the listing and files, with transfers cut short, redirects, bytes that are not
//! the listed ones, a server that ignores `Range`, error statuses): a repository and a single file
//! arrive checked, a broken download goes on where it stopped (the next run, or the next try of the
//! same one), wrong bytes are refused and removed, a repository of another model (or width) is
//! refused before its weights arrive, and an unreachable hub, an error status and a second fetch at
//! once each say what to do; a tiny model with every kind of variant (MLX folders at 4, 6 and 8
//! bits, a GGUF, the bf16 repository) shows a tier fetching the folder of its width and nothing else,
//! the variant present that serves a width chosen, and what arrives loading and running. `cli.rs`: the command line's messages (`doctor` with the machine and its tiers,
//! `models list`, `models fetch` without a hub and from `HF_ENDPOINT`).
//! `golden_prompts.rs` holds the exact
//! prompt per language for a `$0` fixture (expect-test). `support/` holds what they share: the
//! MLX lock, the CPU classes (a test that keeps the cores busy never runs beside one whose
//! deadline is about a second), `laya` as a command, the one fake engine (`engine.rs`), the
//! OpenAI-compatible stub and the daemon helpers (`daemon.rs`), the LSP clients (`lsp.rs`: the
//! in-process service and the byte-level wire client; `laya lsp` processes are driven with
//! `LspProcess`), panics counted per test (`panics.rs`), the tiny GGUF and a vocabulary-only GGUF for models of
//! random weights (`gguf`, the engine's `synthetic::gguf`), the switch's helpers (`real.rs`) and the loopback model hub
//! (`hub.rs`). Test data
//! is in `tests/data/`.

mod support;

mod cli;
mod daemon;
mod faults;
mod fetch_hub;
mod fuzz_lsp;
mod golden_prompts;
mod lsp_server;
mod lsp_transport;
mod remote_llama_cpp;
mod security;
mod service;
mod soak;
mod stale_work;
mod workspace_context;
