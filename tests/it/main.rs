//! laya's integration tests, one binary (`cargo test --test it daemon::` runs one module), on
//! tiny models the tests write; those of real models and llama.cpp need
//! `LAYA_TEST_REAL_MODELS=1`. The engine's own tests are in `crates/laya-engine/src/tests/`.
//!
//! | module | what it tests |
//! |---|---|
//! | `cli` | the command line's messages: a failure is one line naming the fix |
//! | `daemon` | `laya serve` and `laya lsp` processes: HTTP, socket, one shared daemon, queueing |
//! | `faults` | broken weights, killed daemons, full disks, vanishing clients |
//! | `fetch_hub` | `laya models fetch` from a loopback hub: checked, resumed, refused |
//! | `fuzz_lsp` | generated messages through the transport; random edits against a string model |
//! | `golden_prompts` | the exact prompt per language for a `$0` fixture |
//! | `lsp_server` | the LSP server in-process, on a fake engine |
//! | `lsp_waits` | what a request waits for (debounce, explicit requests) and the answer computed ahead of an accept |
//! | `lsp_transport` | malformed input and end of input on `laya lsp`'s stdio |
//! | `remote_llama_cpp` | a real llama.cpp server as the remote tier |
//! | `security` | loopback, private runtime directory, token, request limits, source scans |
//! | `service` | `laya service` install and uninstall |
//! | `soak` | a short `laya bench soak`: nothing lost or doubled, memory flat |
//! | `stale_work` | an abandoned request stops within one prompt chunk or decode step |
//! | `workspace_context` | the workspace index through the LSP server |
//! | `support` | shared: MLX lock, CPU classes, fake engine, OpenAI stub, LSP clients |

mod support;

mod cli;
mod daemon;
mod faults;
mod fetch_hub;
mod fuzz_lsp;
mod golden_prompts;
mod lsp_server;
mod lsp_transport;
mod lsp_waits;
mod remote_llama_cpp;
mod security;
mod service;
mod soak;
mod stale_work;
mod workspace_context;
