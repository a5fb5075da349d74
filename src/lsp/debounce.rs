//! How long an automatic request waits before it asks the model: the debounce, from the
//! typist's own pace.
//!
//! A request started at `w` after a keystroke is wasted when the next keystroke comes before
//! its answer, that is within `(w, w + m]` of the keystroke, `m` being the model's time for the
//! document. So the wait is the shortest `w` (a multiple of [`STEP`], at most [`MAX_WAIT`])
//! at which at most [`WASTE`] of the document's recent gaps between keystrokes fall in that
//! window: at most one keystroke in five starts a model call that the next keystroke cancels.
//! A model that answers well inside the typist's gaps (a GPU) gets no wait at all; one slower
//! than the typist (a CPU) waits until the gap is longer than the typist's usual one, a pause.
//! Tabby's adaptive debounce is the peer (1.5 to 3 times the mean gap, less the expected
//! response time); docs/decisions.md, "The debounce", says why these bounds.
//!
//! An explicit request never waits, and a fixed `debounceMs` set by the user replaces the rule.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

/// The gaps between keystrokes remembered per document.
pub const GAPS: usize = 24;
/// With fewer gaps than this, [`PRIOR_GAP`] stands in for the missing ones.
pub const MIN_GAPS: usize = 4;
/// A moderate typist's gap (about 70 words a minute), the prior before a document has a pace.
pub const PRIOR_GAP: Duration = Duration::from_millis(150);
/// A gap is remembered as at most this long: longer is a pause, whatever its length.
pub const MAX_GAP: Duration = Duration::from_secs(2);
/// The model times remembered per document.
pub const MODEL_TIMES: usize = 8;
/// The share of gaps a wait may leave inside the model's time.
pub const WASTE: f64 = 0.2;
/// The granularity of the wait.
pub const STEP: Duration = Duration::from_millis(5);
/// The longest adaptive wait: a gap this long is a pause for all but the slowest typists, so
/// waiting longer only delays the answer the pause is for.
pub const MAX_WAIT: Duration = Duration::from_millis(250);

/// The wait for `gaps` (recent gaps between keystrokes) and a model that takes `model`.
pub fn wait(gaps: &[Duration], model: Duration) -> Duration {
    let mut all: Vec<Duration> = gaps.iter().map(|g| (*g).min(MAX_GAP)).collect();
    all.resize(all.len().max(MIN_GAPS), PRIOR_GAP);
    let mut w = Duration::ZERO;
    while w < MAX_WAIT {
        let inside = all.iter().filter(|g| **g > w && **g <= w + model).count();
        if inside as f64 <= WASTE * all.len() as f64 {
            return w;
        }
        w += STEP;
    }
    MAX_WAIT
}

/// One document's pace: when it last changed, the gaps between its changes, and how long its
/// model calls took.
#[derive(Debug, Default)]
pub struct Pace {
    last_change: Option<Instant>,
    gaps: VecDeque<Duration>,
    model: VecDeque<Duration>,
}

impl Pace {
    /// The document changed at `at`.
    pub fn changed(&mut self, at: Instant) {
        if let Some(last) = self.last_change {
            push(&mut self.gaps, at.saturating_duration_since(last), GAPS);
        }
        self.last_change = Some(at);
    }

    /// A model call of the document took `took` (a cancelled one: as long as it ran, which
    /// is less than it would have taken).
    pub fn model_took(&mut self, took: Duration) {
        push(&mut self.model, took, MODEL_TIMES);
    }

    /// The median model time, zero before any.
    pub fn model_time(&self) -> Duration {
        let mut v: Vec<Duration> = self.model.iter().copied().collect();
        v.sort();
        v.get(v.len() / 2).copied().unwrap_or_default()
    }

    /// The wait for the document's next automatic request.
    pub fn wait(&self) -> Duration {
        let gaps: Vec<Duration> = self.gaps.iter().copied().collect();
        wait(&gaps, self.model_time())
    }
}

fn push(q: &mut VecDeque<Duration>, d: Duration, cap: usize) {
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|m| Duration::from_millis(*m)).collect()
    }

    #[test]
    fn a_model_faster_than_the_typist_gets_no_wait() {
        let gaps = ms(&[120, 150, 180, 140, 200, 160, 130, 170]);
        assert_eq!(wait(&gaps, Duration::from_millis(30)), Duration::ZERO);
        // Unknown model time (no call yet): no wait either.
        assert_eq!(wait(&gaps, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_model_slower_than_the_typist_waits_for_a_pause() {
        // A CPU model of a second: a request started inside the typist's gaps is cancelled,
        // so the wait outlasts all but a fifth of them (here: past the 180 ms gap).
        let gaps = ms(&[120, 150, 180, 140, 200, 160, 130, 170, 900, 1500]);
        let w = wait(&gaps, Duration::from_millis(1000));
        assert_eq!(w, Duration::from_millis(180));
        let inside = gaps
            .iter()
            .filter(|g| **g > w && **g <= w + Duration::from_secs(1))
            .count();
        assert!(inside as f64 <= WASTE * gaps.len() as f64);
    }

    #[test]
    fn a_faster_typist_waits_less_for_the_same_model() {
        let model = Duration::from_millis(400);
        let slow = wait(&ms(&[300, 350, 280, 320, 400, 330, 310, 290]), model);
        let fast = wait(&ms(&[90, 110, 80, 100, 120, 95, 105, 85]), model);
        assert!(fast < slow, "{fast:?} {slow:?}");
        assert!(slow <= MAX_WAIT);
    }

    #[test]
    fn the_wait_is_bounded_and_the_prior_fills_a_short_history() {
        // Every gap inside any window: the longest wait.
        let gaps = ms(&[5000; 10]);
        assert_eq!(wait(&gaps, Duration::from_secs(10)), MAX_WAIT);
        // No history: the prior's gaps (150 ms) against a 1 s model: wait past them.
        assert_eq!(wait(&[], Duration::from_secs(1)), PRIOR_GAP);
    }

    #[test]
    fn pace_keeps_recent_gaps_and_the_median_model_time() {
        let mut p = Pace::default();
        let t0 = Instant::now();
        for i in 0..(GAPS as u64 + 5) {
            p.changed(t0 + Duration::from_millis(100 * i));
        }
        assert_eq!(p.gaps.len(), GAPS);
        assert!(p.gaps.iter().all(|g| *g == Duration::from_millis(100)));
        for m in [10, 50, 30] {
            p.model_took(Duration::from_millis(m));
        }
        assert_eq!(p.model_time(), Duration::from_millis(30));
        assert_eq!(p.wait(), Duration::ZERO);
    }
}
