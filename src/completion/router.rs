//! The router: which model (size tier and bit width) answers a request, and why.
//!
//! Inputs are what the pipeline knows before calling the engine: how the request was
//! triggered, what the cursor is in (code, comment, string, or a prose language), whether a
//! single line or a block is wanted, the prompt's size, and how fast each model has been
//! lately. The default policy: code typed automatically → small q8; code asked for or a
//! block → large q6; comments, docs and plain text → small q4. An automatic request goes to
//! the large tier only while that tier answers inside the latency budget, and long prompts
//! of automatic requests stay on the small tier. Whether the chosen model is loaded is the
//! pool's business (a loaded one stands in); the explanation shows both.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::pipeline::Trigger;
use crate::{
    engine::{ModelKey, Precision, Tier},
    syntax::CursorKind,
};

/// Languages whose text is prose, not code.
const PROSE_LANGUAGES: &[&str] = &[
    "markdown",
    "plaintext",
    "text",
    "restructuredtext",
    "latex",
    "asciidoc",
];

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouterPolicy {
    /// Code, typed (automatic trigger), rest of a line.
    pub code_automatic: ModelKey,
    /// Code, asked for by the user (a key binding).
    pub code_invoked: ModelKey,
    /// Code, a whole block (the cursor on an empty line).
    pub code_block: ModelKey,
    /// Comments, strings, docs and prose languages.
    pub prose: ModelKey,
    /// An automatic request goes to the large tier only while the large tier's recent
    /// latency is under this many milliseconds.
    pub latency_budget_ms: f64,
    /// Automatic requests with a prompt over this many (estimated) tokens stay small.
    pub large_max_prompt_tokens: usize,
}

impl Default for RouterPolicy {
    fn default() -> Self {
        let key = |tier, precision| ModelKey { tier, precision };
        RouterPolicy {
            code_automatic: key(Tier::Small, Precision::Q8),
            code_invoked: key(Tier::Large, Precision::Q6),
            code_block: key(Tier::Large, Precision::Q6),
            prose: key(Tier::Small, Precision::Q4),
            latency_budget_ms: 400.0,
            large_max_prompt_tokens: 4096,
        }
    }
}

/// What the router decides on.
#[derive(Clone, Debug)]
pub struct RouteInput<'a> {
    pub trigger: Trigger,
    pub cursor_kind: CursorKind,
    pub language_id: &'a str,
    /// A block (multi-line) completion rather than the rest of a line.
    pub block: bool,
    pub prompt_tokens: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Route {
    pub model: ModelKey,
    /// Why, in words: the rule that chose and any rule that changed the choice.
    pub reason: String,
}

/// Recent latency per model (exponential moving average of total request time).
#[derive(Debug, Default)]
pub struct Latencies {
    ms: HashMap<ModelKey, f64>,
}

impl Latencies {
    pub fn record(&mut self, key: ModelKey, ms: f64) {
        let e = self.ms.entry(key).or_insert(ms);
        *e = 0.7 * *e + 0.3 * ms;
    }

    pub fn get(&self, key: ModelKey) -> Option<f64> {
        self.ms.get(&key).copied()
    }
}

pub fn route(policy: &RouterPolicy, input: &RouteInput, latencies: &Latencies) -> Route {
    let prose = input.cursor_kind != CursorKind::Code || PROSE_LANGUAGES.contains(&input.language_id);
    let (mut model, mut reason) = if prose {
        let what = if PROSE_LANGUAGES.contains(&input.language_id) {
            format!("{} text", input.language_id)
        } else {
            format!("cursor in a {:?}", input.cursor_kind).to_lowercase()
        };
        (policy.prose, format!("{what} → prose policy"))
    } else if input.trigger == Trigger::Invoked {
        (policy.code_invoked, "code, invoked → invoked policy".to_owned())
    } else if input.block {
        (
            policy.code_block,
            "code, block completion → block policy".to_owned(),
        )
    } else {
        (
            policy.code_automatic,
            "code, typed, rest of the line → automatic policy".to_owned(),
        )
    };
    if input.trigger == Trigger::Automatic && model.tier == Tier::Large {
        let small = ModelKey {
            tier: Tier::Small,
            precision: policy.code_automatic.precision,
        };
        if input.prompt_tokens > policy.large_max_prompt_tokens {
            reason.push_str(&format!(
                "; prompt of ~{} tokens over {} → small tier",
                input.prompt_tokens, policy.large_max_prompt_tokens
            ));
            model = small;
        } else if let Some(ms) = latencies.get(model).filter(|&ms| ms > policy.latency_budget_ms) {
            reason.push_str(&format!(
                "; {model} recently took {ms:.0} ms, over the {:.0} ms budget → small tier",
                policy.latency_budget_ms
            ));
            model = small;
        }
    }
    Route { model, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(trigger: Trigger, kind: CursorKind, lang: &str, block: bool, tokens: usize) -> RouteInput<'_> {
        RouteInput {
            trigger,
            cursor_kind: kind,
            language_id: lang,
            block,
            prompt_tokens: tokens,
        }
    }

    fn key(tier: Tier, precision: Precision) -> ModelKey {
        ModelKey { tier, precision }
    }

    #[test]
    fn default_policy_table() {
        use CursorKind::*;
        use Trigger::*;
        let p = RouterPolicy::default();
        let l = Latencies::default();
        let cases = [
            (Automatic, Code, "rust", false, key(Tier::Small, Precision::Q8)),
            (Automatic, Code, "rust", true, key(Tier::Large, Precision::Q6)),
            (Invoked, Code, "python", false, key(Tier::Large, Precision::Q6)),
            (
                Automatic,
                Comment,
                "python",
                false,
                key(Tier::Small, Precision::Q4),
            ),
            (Invoked, String, "go", true, key(Tier::Small, Precision::Q4)),
            (
                Automatic,
                Code,
                "markdown",
                false,
                key(Tier::Small, Precision::Q4),
            ),
        ];
        for (trigger, kind, lang, block, want) in cases {
            let r = route(&p, &input(trigger, kind, lang, block, 100), &l);
            assert_eq!(
                r.model, want,
                "{trigger:?} {kind:?} {lang} block={block}: {}",
                r.reason
            );
            assert!(!r.reason.is_empty());
        }
    }

    #[test]
    fn automatic_requests_leave_the_large_tier_when_slow_or_long() {
        let p = RouterPolicy::default();
        let mut l = Latencies::default();
        let block = input(Trigger::Automatic, CursorKind::Code, "rust", true, 100);
        l.record(key(Tier::Large, Precision::Q6), 900.0);
        let r = route(&p, &block, &l);
        assert_eq!(r.model, key(Tier::Small, Precision::Q8));
        assert!(r.reason.contains("900 ms"), "{}", r.reason);
        // An invoked request waits for the large model however slow.
        let invoked = input(Trigger::Invoked, CursorKind::Code, "rust", true, 100);
        assert_eq!(route(&p, &invoked, &l).model.tier, Tier::Large);
        // Fast again: back to large.
        for _ in 0..10 {
            l.record(key(Tier::Large, Precision::Q6), 100.0);
        }
        assert_eq!(route(&p, &block, &l).model.tier, Tier::Large);
        let long = input(Trigger::Automatic, CursorKind::Code, "rust", true, 5000);
        let r = route(&p, &long, &l);
        assert_eq!(r.model.tier, Tier::Small);
        assert!(r.reason.contains("5000"), "{}", r.reason);
    }

    #[test]
    fn policy_reads_from_client_settings() {
        let p: RouterPolicy = serde_json::from_value(serde_json::json!({
            "prose": {"tier": "large", "precision": "q8"},
            "latencyBudgetMs": 50.0
        }))
        .unwrap();
        assert_eq!(p.prose, key(Tier::Large, Precision::Q8));
        assert_eq!(p.code_automatic, RouterPolicy::default().code_automatic);
    }
}
