//! The router: which model (size tier and bit width) answers a request, and why.
//!
//! Inputs are what the pipeline knows before it builds the prompt: how the request was
//! triggered, what the cursor is in (code, comment, string, or a prose language), whether a
//! single line or a block is wanted, how many prompt tokens the model will have to run, and how
//! fast each model is. The default policy: code typed automatically → small q8; code asked for
//! or a block → large q6; comments, docs and plain text → small q4. A request goes to the
//! large tier only while the large model is expected to answer inside the latency budget of
//! its trigger (automatic 400 ms, invoked 3 s): from its measured speed, or before any
//! measurement from an estimate by its size and where it runs ([`ModelFacts`]), so a slow
//! backend (a 1.5B on MLX's CPU takes minutes for a cold prompt) never keeps the editor
//! waiting on it. Long prompts of automatic requests stay on the small tier. Whether the
//! chosen model is loaded is the pool's business (a loaded one stands in); the explanation
//! shows both.
//!
//! [`ModelFacts`]: crate::engine::ModelFacts

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::pipeline::Trigger;
use crate::{
    engine::{ModelKey, Precision, Speed, Tier, Timing},
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
    /// An automatic request goes to the large tier only while the large model is expected to
    /// answer within this many milliseconds.
    pub latency_budget_ms: f64,
    /// The same for a request the user asked for (they wait for it, but not for minutes).
    pub invoked_latency_budget_ms: f64,
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
            invoked_latency_budget_ms: 3000.0,
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
    /// The prompt's size (estimated tokens).
    pub prompt_tokens: usize,
    /// Prompt tokens the model will have to run: all of a fresh prompt, only the typed tail of
    /// a prompt that continues the last one.
    pub new_tokens: usize,
    /// The most tokens the answer may take.
    pub max_tokens: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Route {
    pub model: ModelKey,
    /// Why, in words: the rule that chose and any rule that changed the choice.
    pub reason: String,
}

/// How fast each model was lately: exponential moving averages of the prefill and decode
/// rates (ms a token) of the requests it answered.
#[derive(Debug, Default)]
pub struct Latencies {
    rates: HashMap<ModelKey, [Option<f64>; 2]>,
}

impl Latencies {
    /// Fold one answered request's timing into `key`'s rates. A request that prefilled or
    /// decoded too little to time says nothing of that rate.
    pub fn record(&mut self, key: ModelKey, t: &Timing) {
        let prefill =
            (t.prefilled_tokens >= 8).then(|| t.prefill.as_secs_f64() * 1e3 / t.prefilled_tokens as f64);
        let decode =
            (t.generated_tokens >= 2).then(|| t.decode.as_secs_f64() * 1e3 / t.generated_tokens as f64);
        let rates = self.rates.entry(key).or_default();
        for (old, new) in rates.iter_mut().zip([prefill, decode]) {
            if let Some(new) = new {
                *old = Some(old.map_or(new, |old| 0.7 * old + 0.3 * new));
            }
        }
    }

    /// `key`'s measured rates, once both were measured.
    pub fn get(&self, key: ModelKey) -> Option<Speed> {
        match self.rates.get(&key)? {
            [Some(prefill), Some(decode)] => Some(Speed {
                prefill_ms_per_token: *prefill,
                decode_ms_per_token: *decode,
            }),
            _ => None,
        }
    }
}

/// A model's speed as the router sees it: measured, or estimated before any measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KnownSpeed {
    Measured(Speed),
    Estimated(Speed),
}

/// The answer's length the router expects of a request: half of its most tokens (answers stop
/// at their line or block well before the limit).
fn expected_tokens(max_tokens: usize) -> usize {
    max_tokens.div_ceil(2)
}

/// The route for `input`. `speed` tells how fast a model is (`None`: unknown, e.g. a remote
/// server not measured yet).
pub fn route(
    policy: &RouterPolicy,
    input: &RouteInput,
    speed: impl Fn(ModelKey) -> Option<KnownSpeed>,
) -> Route {
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
    if model.tier == Tier::Large {
        let small = ModelKey {
            tier: Tier::Small,
            precision: policy.code_automatic.precision,
        };
        let budget = match input.trigger {
            Trigger::Automatic => policy.latency_budget_ms,
            Trigger::Invoked => policy.invoked_latency_budget_ms,
        };
        let expect = |key| {
            let (s, how) = match speed(key)? {
                KnownSpeed::Measured(s) => (s, "measured"),
                KnownSpeed::Estimated(s) => (s, "estimated"),
            };
            Some((
                s.request_ms(input.new_tokens, expected_tokens(input.max_tokens)),
                how,
            ))
        };
        if input.trigger == Trigger::Automatic && input.prompt_tokens > policy.large_max_prompt_tokens {
            reason.push_str(&format!(
                "; prompt of ~{} tokens over {} → small tier",
                input.prompt_tokens, policy.large_max_prompt_tokens
            ));
            model = small;
        } else if let Some((ms, how)) = expect(model).filter(|&(ms, _)| ms > budget) {
            reason.push_str(&format!(
                "; {model} would take ~{ms:.0} ms ({how} speed, {} prompt tokens to run), over the {budget:.0} ms budget → small tier",
                input.new_tokens
            ));
            if let Some((small_ms, how)) = expect(small).filter(|&(small_ms, _)| small_ms > budget) {
                reason.push_str(&format!(
                    " (itself ~{small_ms:.0} ms, {how}: the fastest there is)"
                ));
            }
            model = small;
        }
    }
    Route { model, reason }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn input(trigger: Trigger, kind: CursorKind, lang: &str, block: bool, tokens: usize) -> RouteInput<'_> {
        RouteInput {
            trigger,
            cursor_kind: kind,
            language_id: lang,
            block,
            prompt_tokens: tokens,
            new_tokens: tokens,
            max_tokens: if block { 128 } else { 48 },
        }
    }

    fn key(tier: Tier, precision: Precision) -> ModelKey {
        ModelKey { tier, precision }
    }

    fn unknown(_: ModelKey) -> Option<KnownSpeed> {
        None
    }

    /// A timing of `prefilled` tokens at `prefill_ms` a token and `generated` at `decode_ms`.
    fn timing(prefilled: usize, prefill_ms: f64, generated: usize, decode_ms: f64) -> Timing {
        Timing {
            prompt_tokens: prefilled,
            prefilled_tokens: prefilled,
            generated_tokens: generated,
            prefill: Duration::from_secs_f64(prefilled as f64 * prefill_ms / 1e3),
            decode: Duration::from_secs_f64(generated as f64 * decode_ms / 1e3),
            ..Timing::default()
        }
    }

    fn measured(l: &Latencies) -> impl Fn(ModelKey) -> Option<KnownSpeed> + '_ {
        |k| l.get(k).map(KnownSpeed::Measured)
    }

    #[test]
    fn default_policy_table() {
        use CursorKind::*;
        use Trigger::*;
        let p = RouterPolicy::default();
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
            let r = route(&p, &input(trigger, kind, lang, block, 100), unknown);
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
        // 100 tokens at 1 ms and 64 expected at 12 ms: ~870 ms, over 400.
        l.record(key(Tier::Large, Precision::Q6), &timing(100, 1.0, 20, 12.0));
        let r = route(&p, &block, measured(&l));
        assert_eq!(r.model, key(Tier::Small, Precision::Q8));
        assert!(
            r.reason.contains("~868 ms") && r.reason.contains("measured"),
            "{}",
            r.reason
        );
        // Fast again: back to large.
        for _ in 0..10 {
            l.record(key(Tier::Large, Precision::Q6), &timing(100, 0.5, 20, 2.0));
        }
        assert_eq!(route(&p, &block, measured(&l)).model.tier, Tier::Large);
        let long = input(Trigger::Automatic, CursorKind::Code, "rust", true, 5000);
        let r = route(&p, &long, measured(&l));
        assert_eq!(r.model.tier, Tier::Small);
        assert!(r.reason.contains("5000"), "{}", r.reason);
    }

    #[test]
    fn invoked_and_block_requests_leave_a_large_model_too_slow_for_their_budget() {
        let p = RouterPolicy::default();
        let large = key(Tier::Large, Precision::Q6);
        let mut l = Latencies::default();
        // 1,000 prompt tokens at 1 ms and 64 tokens at 20 ms: ~2.3 s, inside the invoked
        // budget (3 s), over the automatic one.
        l.record(large, &timing(1000, 1.0, 30, 20.0));
        let invoked = input(Trigger::Invoked, CursorKind::Code, "rust", true, 1000);
        assert_eq!(route(&p, &invoked, measured(&l)).model, large);
        let block = input(Trigger::Automatic, CursorKind::Code, "rust", true, 1000);
        assert_eq!(route(&p, &block, measured(&l)).model.tier, Tier::Small);
        // Ten times slower: an invoked request does not wait for it either.
        let mut slow = Latencies::default();
        slow.record(large, &timing(1000, 10.0, 30, 200.0));
        let r = route(&p, &invoked, measured(&slow));
        assert_eq!(r.model, key(Tier::Small, Precision::Q8), "{}", r.reason);
        assert!(r.reason.contains("3000 ms budget"), "{}", r.reason);
        // A prompt that continues the last one runs only its new tokens.
        let anchored = RouteInput {
            new_tokens: 4,
            ..input(Trigger::Automatic, CursorKind::Code, "rust", true, 1000)
        };
        let mut fast_decode = Latencies::default();
        fast_decode.record(large, &timing(1000, 2.0, 30, 5.0));
        assert_eq!(route(&p, &block, measured(&fast_decode)).model.tier, Tier::Small);
        assert_eq!(route(&p, &anchored, measured(&fast_decode)).model, large);
    }

    #[test]
    fn before_any_measurement_the_estimate_decides_and_the_reason_says_so() {
        use crate::engine::{ModelFacts, RunsOn};
        let p = RouterPolicy::default();
        let facts = |tier: Tier, runs_on| ModelFacts {
            parameters: Some(if tier == Tier::Large {
                1_540_000_000
            } else {
                494_000_000
            }),
            active_parameters: None,
            bits: 6,
            runs_on,
            family: Default::default(),
        };
        let on = |runs_on| {
            move |k: ModelKey| {
                facts(k.tier, runs_on)
                    .estimated_speed()
                    .map(KnownSpeed::Estimated)
            }
        };
        // MLX's CPU: the 1.5B would take minutes; the 0.5B is slow too, but the fastest.
        let invoked = input(Trigger::Invoked, CursorKind::Code, "python", false, 1500);
        let r = route(&p, &invoked, on(RunsOn::Cpu));
        assert_eq!(r.model.tier, Tier::Small, "{}", r.reason);
        assert!(
            r.reason.contains("estimated") && r.reason.contains("the fastest there is"),
            "{}",
            r.reason
        );
        // A GPU: the 1.5B answers an invoked request in well under its budget.
        assert_eq!(route(&p, &invoked, on(RunsOn::Gpu)).model.tier, Tier::Large);
        // A remote server's speed is unknown until measured: the policy stands.
        assert_eq!(route(&p, &invoked, on(RunsOn::Remote)).model.tier, Tier::Large);
    }

    /// A mixture of experts is estimated by the parameters a token runs through: the
    /// 30B-A3B (3.35B active) answers an invoked request on a GPU in its budget, where a dense
    /// model of its 30.5B would not.
    #[test]
    fn a_mixture_of_experts_is_estimated_by_its_active_parameters() {
        use crate::engine::{ModelFacts, RunsOn};
        let p = RouterPolicy::default();
        let estimate = |active: Option<u64>| {
            move |k: ModelKey| {
                ModelFacts {
                    parameters: Some(if k.tier == Tier::Large {
                        30_530_000_000
                    } else {
                        3_090_000_000
                    }),
                    active_parameters: active.filter(|_| k.tier == Tier::Large),
                    bits: 6,
                    runs_on: RunsOn::Gpu,
                    family: Default::default(),
                }
                .estimated_speed()
                .map(KnownSpeed::Estimated)
            }
        };
        let invoked = input(Trigger::Invoked, CursorKind::Code, "python", true, 1500);
        let r = route(&p, &invoked, estimate(Some(3_350_000_000)));
        assert_eq!(r.model.tier, Tier::Large, "{}", r.reason);
        let r = route(&p, &invoked, estimate(None));
        assert_eq!(r.model.tier, Tier::Small, "{}", r.reason);
    }

    #[test]
    fn timings_too_short_to_time_leave_the_rates_alone() {
        let mut l = Latencies::default();
        let k = key(Tier::Small, Precision::Q8);
        l.record(k, &timing(2, 100.0, 1, 100.0));
        assert_eq!(l.get(k), None);
        l.record(k, &timing(100, 1.0, 1, 100.0));
        assert_eq!(l.get(k), None, "no decode rate yet");
        l.record(k, &timing(2, 100.0, 10, 3.0));
        let s = l.get(k).unwrap();
        assert!((s.prefill_ms_per_token - 1.0).abs() < 1e-9, "{s:?}");
        assert!((s.decode_ms_per_token - 3.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn policy_reads_from_client_settings() {
        let p: RouterPolicy = serde_json::from_value(serde_json::json!({
            "prose": {"tier": "large", "precision": "q8"},
            "latencyBudgetMs": 50.0,
            "invokedLatencyBudgetMs": 900.0
        }))
        .unwrap();
        assert_eq!(p.prose, key(Tier::Large, Precision::Q8));
        assert_eq!(p.invoked_latency_budget_ms, 900.0);
        assert_eq!(p.code_automatic, RouterPolicy::default().code_automatic);
    }
}
