//! Turning raw model output into what an editor should insert.
//!
//! ## How it works
//!
//! `lead.rs`: the syntax layer's context as the prompt's local parts, most important first
//! (enclosing scopes innermost first, this file's types in reach, nearby functions); in the
//! `outline` layout each is written as the file shows it: at its indentation, an enclosing scope
//! open (`impl P {`), another function's body elided (`fn f() { ... }`, Python's indented `...`).
//! `pipeline.rs`: one keystroke flows one way. `plan` (context → route → the routed model's
//! budget, `Engine::facts` giving its size → prompt) makes a `Plan`; the engine runs its request;
//! `finish` ranks, post-processes and remembers. Sees the engine only through the `Engine` trait.
//! A request outside an editor's session (HTTP `/complete`, `laya complete`) takes the same
//! plan through `plan_once` (the route fixed where the request names a model; no anchor
//! continued or stored) and `finish_once` (nothing of the document kept).
//! Per document it keeps the last shown suggestion (`Shown`: typing its first characters is
//! answered from it, no model call), an `Anchor` (text, cursor, budget and prompt of the last
//! fresh prompt: while the only change is text typed at that cursor and the route gives the same
//! budget, the next prompt is the anchor's prompt + the typed text, so the engine's prefix store
//! reuses all but the new tokens, and the workspace index is not asked again: the anchor's
//! context files stand), and the last request's `Explanation` for `laya/explain`.
//! `candidates` above 1 asks the engine for that many continuations of distinct first tokens (one
//! batch after one prefill); the greedy one stays first and the others follow by summed
//! log-probability. Each edit keeps its `Origin` (engine choice index, tokens, log-probability),
//! which `laya bench quality` records.
//! `router.rs`: the policy that picks the model key from trigger, cursor kind, prose language,
//! line vs block and prompt size, and keeps a request off the large tier while that model is
//! expected to miss the trigger's latency budget: from its measured prefill and decode rates
//! (`Latencies`), else from `ModelFacts::estimated_speed` (parameters, for a mixture of experts the
//! active ones, bits, CPU/GPU); the reason
//! in words. Whether a request asks for a line or a block is the pipeline's: an automatic request
//! asks for the rest of the line (ending at the line break) unless `Surroundings::starts_empty_block`
//! (the cursor starts an empty block or a blank end of file); an invoked one off mid-line asks for
//! a block. `postprocess.rs`: the rules applied to a
//! generated middle (no second indentation on a line indented already, cut where it re-creates
//! the suffix, single line mid-line, stop at a dedent, trim, merge closing brackets/quotes that
//! already follow the cursor into the item's range).

pub mod lead;
pub mod pipeline;
pub mod postprocess;
pub mod router;
