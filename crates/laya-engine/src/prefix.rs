//! The prefix store: token sequences a model has already run, with their KV caches, so that a
//! request whose prompt starts like an earlier one prefills only the tail.
//!
//! Each entry's caches hold exactly its ids (`caches[0].offset() == ids.len()`). A lookup
//! takes the entry with the longest common prefix *out* of the store (so the caller's updates
//! happen in place, with no copy of the buffers), trimmed to that prefix; the caller puts the
//! extended sequence back when it is done. A model with recurrent layers (Qwen3.5) can go
//! back only to a length its states were kept at ([`crate::cache::restorable`]): its reuse is
//! the longest such length within the common prefix, never a later one. An entry also keeps
//! its prompt's last logits, so the same prompt again runs no forward before its first token
//! (a recurrent model keeps its state at the prompt's end for it). Bounded by entry count and
//! by bytes, least recently used first out.

use mlx_rs::Array;

use crate::{
    cache::{restorable, rewind, KvCache},
    cancel::Cancel,
    generate::{generate_from, Control, GenerateError, GenerateOutput, GenerateRequest, Pacing, Start},
    models::Model,
};

/// Limits of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixLimits {
    /// Most entries kept (`prefill-cache-size`); 0 turns reuse off.
    pub max_entries: usize,
    /// Most bytes of KV buffers kept.
    pub max_bytes: usize,
}

impl Default for PrefixLimits {
    fn default() -> Self {
        PrefixLimits {
            max_entries: 8,
            max_bytes: 1 << 30,
        }
    }
}

struct Entry {
    ids: Vec<u32>,
    caches: Vec<KvCache>,
    /// The logits after the first `len` ids (a prompt's last position), `[1, vocab]`.
    end: Option<(usize, Array)>,
    bytes: usize,
    last_used: u64,
}

impl Entry {
    /// The length this entry's caches can give `ids`: all of them where it ran exactly that
    /// prompt and kept its logits, else the longest length within the common prefix, short of
    /// the last id, its recurrent states can go back to.
    fn reuse_for(&self, ids: &[u32]) -> usize {
        let common = common_prefix(&self.ids, ids);
        let n = ids.len();
        if self.end.as_ref().is_some_and(|(len, _)| *len == n)
            && common >= n
            && restorable(&self.caches, n) == n
        {
            return n;
        }
        restorable(&self.caches, common.min(n.saturating_sub(1)))
    }
}

/// A hit: how many leading ids the caches already hold, and the logits after them when that
/// is the whole prompt.
pub(crate) struct Reuse {
    pub(crate) reused: usize,
    pub(crate) caches: Vec<KvCache>,
    pub(crate) logits: Option<Array>,
}

pub(crate) struct PrefixStore {
    entries: Vec<Entry>,
    limits: PrefixLimits,
    clock: u64,
}

/// Tokens before the cursor that a recurrent model's anchor stays back: as a word is typed its
/// last tokens turn into others (`pri` into `print`), so the state kept just before them is
/// the one the next keystroke's prompt still shares.
pub(crate) const ANCHOR_BEFORE_CURSOR: usize = 4;

/// Where a fill-in-the-middle prompt's next keystroke will part from it: a few tokens before
/// the end of its prefix (the last `fim_suffix` token), `None` without one.
pub(crate) fn fim_anchor(ids: &[u32], fim_suffix: u32) -> Option<usize> {
    let cursor = ids.iter().rposition(|&t| t == fim_suffix)?;
    Some(cursor.saturating_sub(ANCHOR_BEFORE_CURSOR)).filter(|&a| a > 0)
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixStore {
    pub(crate) fn new(limits: PrefixLimits) -> Self {
        PrefixStore {
            entries: vec![],
            limits,
            clock: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of KV buffers held.
    pub(crate) fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Take out the entry sharing the longest prefix with `ids`, trimmed to that prefix and
    /// to at most `ids.len() - 1` (the last prompt id must run to give the next logits) unless
    /// the entry kept the logits of exactly `ids`, and further to a length its recurrent
    /// states can go back to. `None` when nothing shares even one id.
    pub(crate) fn take(&mut self, ids: &[u32]) -> Option<Reuse> {
        let (best, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.reuse_for(ids)))
            .max_by_key(|&(i, len)| (len, self.entries[i].last_used))?;
        if len == 0 {
            return None;
        }
        let mut entry = self.entries.swap_remove(best);
        rewind(&mut entry.caches, len);
        // The whole prompt comes only with its logits (`Entry::reuse_for`).
        let logits = entry.end.filter(|_| len == ids.len()).map(|(_, l)| l);
        Some(Reuse {
            reused: len,
            caches: entry.caches,
            logits,
        })
    }

    /// Keep `caches`, which hold `ids` (or a prefix of them: `ids` is cut to what they hold),
    /// with `end`, the logits after a prompt's first ids, where known. Entries that are a
    /// prefix of the new one go where it covers them (it can go back to their length: always,
    /// without recurrent layers); then the least recently used go until the limits hold.
    pub(crate) fn insert(&mut self, mut ids: Vec<u32>, caches: Vec<KvCache>, end: Option<(usize, Array)>) {
        if self.limits.max_entries == 0 {
            return;
        }
        let held = caches.first().map_or(0, KvCache::offset);
        ids.truncate(held);
        // The state before the last decode step is no place a later prompt parts from.
        let mut caches = caches;
        caches.iter_mut().for_each(KvCache::forget_previous);
        if ids.is_empty() || caches.iter().any(|c| c.batch_size() != Some(1)) {
            return;
        }
        self.entries.retain(|e| {
            let n = e.ids.len();
            !(n <= ids.len() && ids[..n] == e.ids[..] && restorable(&caches, n) == n)
        });
        self.clock += 1;
        let end = end.filter(|(len, _)| *len <= ids.len());
        let bytes =
            caches.iter().map(KvCache::nbytes).sum::<usize>() + end.as_ref().map_or(0, |(_, l)| l.nbytes());
        self.entries.push(Entry {
            ids,
            caches,
            end,
            bytes,
            last_used: self.clock,
        });
        while self.entries.len() > self.limits.max_entries || self.bytes() > self.limits.max_bytes {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
                .expect("over the limits means not empty");
            self.entries.swap_remove(oldest);
        }
    }
}

/// Generate for the whole prompt `ids`, reusing the store's longest shared prefix and putting
/// the result back (prompt and, for one candidate, the generated tokens, so that a request
/// continuing this one reuses them too). Returns the output and how many ids
/// were reused.
pub(crate) fn generate_with_store(
    model: &Model,
    store: Option<&std::sync::Mutex<PrefixStore>>,
    ids: &[u32],
    req: &GenerateRequest,
    cancel: &Cancel,
    on_token: impl FnMut(usize, u32) -> Control,
) -> Result<(GenerateOutput, usize), GenerateError> {
    let pacing = Pacing::for_model(model);
    generate_with_store_paced(model, store, ids, req, cancel, pacing, on_token)
}

/// [`generate_with_store`] with the prompt's chunks cut as `pacing` says.
pub(crate) fn generate_with_store_paced(
    model: &Model,
    store: Option<&std::sync::Mutex<PrefixStore>>,
    ids: &[u32],
    req: &GenerateRequest,
    cancel: &Cancel,
    pacing: Pacing,
    on_token: impl FnMut(usize, u32) -> Control,
) -> Result<(GenerateOutput, usize), GenerateError> {
    let hit = store.and_then(|s| s.lock().unwrap_or_else(|p| p.into_inner()).take(ids));
    let (reused, mut caches, ready) = match hit {
        Some(h) => (h.reused, h.caches, h.logits),
        None => (0, model.new_caches(), None),
    };
    // Drafts are looked up in the whole prompt: hand them the cached part too (only then).
    let drafting;
    let req = if req.speculation.is_on() && reused > 0 {
        drafting = GenerateRequest {
            history: ids[..reused].to_vec(),
            ..req.clone()
        };
        &drafting
    } else {
        req
    };
    let first = match ready {
        Some(logits) => Start::Ready(logits),
        None => Start::Prefill(&ids[reused..]),
    };
    let out = generate_from(model, &mut caches, first, req, cancel, pacing, on_token)?;
    if let Some(s) = store {
        // The caches hold a prefix of this (`insert` cuts it to what they hold).
        let mut seq = ids.to_vec();
        seq.extend_from_slice(&out.candidates[0]);
        let end = out.prompt_logits.clone().map(|l| (ids.len(), l));
        s.lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(seq, caches, end);
    }
    Ok((out, reused))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{test_util::tiny_model, Arch};
    use mlx_rs::Array;

    fn filled(model: &crate::models::Model, ids: &[u32]) -> Vec<KvCache> {
        let mut caches = model.new_caches();
        model
            .forward(&Array::from_slice(ids, &[1, ids.len() as i32]), &mut caches)
            .unwrap();
        caches
    }

    #[test]
    fn takes_the_longest_shared_prefix_and_leaves_one_id_to_run() {
        let model = tiny_model(Arch::Qwen2, 3);
        let mut store = PrefixStore::new(PrefixLimits::default());
        store.insert(vec![1, 2, 3, 4], filled(&model, &[1, 2, 3, 4]), None);
        store.insert(vec![1, 2, 9], filled(&model, &[1, 2, 9]), None);
        assert_eq!(store.len(), 2);
        let hit = store.take(&[1, 2, 3, 7, 8]).unwrap();
        assert_eq!(hit.reused, 3);
        assert_eq!(hit.caches[0].offset(), 3);
        assert_eq!(store.len(), 1, "a hit is taken out");
        // The whole prompt cached: keep the last id to run.
        let hit = store.take(&[1, 2, 9]).unwrap();
        assert_eq!(hit.reused, 2);
        assert!(store.take(&[5, 6]).is_none());
    }

    #[test]
    fn an_extension_replaces_its_prefix_and_limits_evict_the_oldest() {
        let model = tiny_model(Arch::Qwen2, 3);
        let mut store = PrefixStore::new(PrefixLimits {
            max_entries: 2,
            max_bytes: usize::MAX,
        });
        store.insert(vec![1, 2], filled(&model, &[1, 2]), None);
        store.insert(vec![1, 2, 3], filled(&model, &[1, 2, 3]), None);
        assert_eq!(store.len(), 1);
        store.insert(vec![4], filled(&model, &[4]), None);
        store.insert(vec![5], filled(&model, &[5]), None);
        assert_eq!(store.len(), 2);
        assert!(store.take(&[1, 2, 3, 4]).is_none(), "the oldest went first");
        // Ids longer than the caches are cut to what the caches hold.
        store.insert(vec![7, 7, 7, 7], filled(&model, &[7, 7]), None);
        assert_eq!(store.take(&[7, 7, 7, 7]).unwrap().reused, 2);
        // A byte limit below one entry keeps nothing.
        let mut tiny = PrefixStore::new(PrefixLimits {
            max_entries: 8,
            max_bytes: 1,
        });
        tiny.insert(vec![1], filled(&model, &[1]), None);
        assert!(tiny.is_empty());
        let mut off = PrefixStore::new(PrefixLimits {
            max_entries: 0,
            max_bytes: usize::MAX,
        });
        off.insert(vec![1], filled(&model, &[1]), None);
        assert!(off.is_empty());
    }

    /// Random edits of a token sequence (insert, delete, replace, append, truncate), each run
    /// with the store and from scratch: the same greedy tokens and (nearly) the same logits.
    #[test]
    fn reuse_gives_the_output_of_no_reuse_for_random_edit_sequences() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let model = tiny_model(Arch::Qwen3, 11);
        let store = std::sync::Mutex::new(PrefixStore::new(PrefixLimits {
            max_entries: 3,
            max_bytes: usize::MAX,
        }));
        let req = GenerateRequest {
            max_tokens: 5,
            n: 1,
            sampling: crate::seam::SamplingParams::default(),
            stop_token_ids: vec![],
            branch_first: false,
            speculation: crate::draft::Speculation::Off,
            history: vec![],
            anchor: None,
        };
        let no = crate::cancel::Cancel::new();
        let mut rng = StdRng::seed_from_u64(7);
        // Ids stay below the tiny model's vocabulary (97).
        let mut ids: Vec<u32> = (0..40).map(|_| rng.gen_range(1..97)).collect();
        let mut reused_total = 0;
        for step in 0..24 {
            let at = rng.gen_range(0..=ids.len());
            match rng.gen_range(0..5) {
                0 => ids.insert(at, rng.gen_range(1..97)),
                1 if ids.len() > 2 => {
                    ids.remove(at.min(ids.len() - 1));
                }
                2 if at < ids.len() => ids[at] = rng.gen_range(1..97),
                3 => ids.extend((0..rng.gen_range(1..4)).map(|_| rng.gen_range(1..97u32))),
                _ if ids.len() > 8 => ids.truncate(ids.len() - 3),
                _ => ids.push(3),
            }
            let (cached, reused) =
                generate_with_store(&model, Some(&store), &ids, &req, &no, |_, _| Control::Continue).unwrap();
            let (fresh, none) =
                generate_with_store(&model, None, &ids, &req, &no, |_, _| Control::Continue).unwrap();
            assert_eq!(none, 0);
            assert_eq!(
                cached.candidates, fresh.candidates,
                "step {step}: ids {ids:?}, reused {reused}"
            );
            assert_eq!(cached.prefill_tokens, ids.len() - reused);
            reused_total += reused;
        }
        assert!(
            reused_total > 24 * 10,
            "edits leave long shared prefixes: reused {reused_total}"
        );
    }

    #[test]
    fn reused_logits_equal_fresh_logits() {
        let model = tiny_model(Arch::Qwen2, 5);
        let ids: Vec<u32> = (1..30).collect();
        let mut store = PrefixStore::new(PrefixLimits::default());
        store.insert(ids[..20].to_vec(), filled(&model, &ids[..20]), None);
        let hit = store.take(&ids).unwrap();
        let mut caches = hit.caches;
        let tail = &ids[hit.reused..];
        let a = model
            .forward(&Array::from_slice(tail, &[1, tail.len() as i32]), &mut caches)
            .unwrap();
        let b = model
            .forward(
                &Array::from_slice(&ids, &[1, ids.len() as i32]),
                &mut model.new_caches(),
            )
            .unwrap();
        let diff = mlx_rs::ops::abs(&(&a - &b))
            .unwrap()
            .max(None)
            .unwrap()
            .item_exact::<f32>();
        assert!(diff < 1e-4, "max |Δlogit| {diff}");
    }
}
