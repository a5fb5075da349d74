//! Per-layer KV cache, shaped like mlx-lm's `KVCache`: keys and values live in buffers
//! `[B, kv_heads, capacity, head_dim]` grown `STEP` positions at a time; each forward writes
//! its new positions with a slice update and reads back the first `offset` positions.
//!
//! MLX arrays are values: a slice update makes a new array (done in place only when nothing
//! else holds the buffer). So `clone()` is a cheap, independent copy: updating one clone
//! never changes another, which is what a prefix store wants.
//!
//! A Gated DeltaNet layer (Qwen3.5) keeps no keys and values but a recurrent state: the last
//! `kernel - 1` rows of its convolution's input and the delta rule's matrix per value head.
//! Such a state cannot be cut back to an earlier position; it can only be replaced by a state
//! kept from that position (a checkpoint). The cache keeps the state before its last update,
//! so the last forward can be undone, the states [`checkpoint`] asked it to keep (at most
//! [`KEPT`], spread out) and the one at its prompt's end ([`checkpoint_end`]);
//! [`restorable`] says which earlier lengths a set of a model's caches can return to and
//! [`rewind`] returns them there, every layer alike: never a later state, never a zero state
//! beside keys of a longer prefix.

use mlx_rs::error::{Exception, Result};
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{broadcast_to, concatenate, zeros_dtype};
use mlx_rs::Array;

use crate::direct::slice_update;

/// Positions a buffer grows by.
pub const STEP: i32 = 256;

#[derive(Clone, Default)]
pub struct KvCache {
    /// `[B, kv_heads, capacity, head_dim]`; positions past `offset` are stale.
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    /// A recurrent layer's state after `offset` positions, in place of keys and values.
    recurrent: Option<Recurrent>,
    /// The recurrent state before its last update, at the offset it held then.
    previous: Option<(usize, Recurrent)>,
    /// States kept on purpose ([`KvCache::keep`]), offsets ascending, at most [`KEPT`].
    kept: Vec<(usize, Recurrent)>,
    /// The state at the end of the last prompt ([`KvCache::keep_end`]), until the next's:
    /// the same prompt again starts from it.
    end: Option<(usize, Recurrent)>,
    /// Shared by the clones of this cache that hold the same key and value buffers: while no
    /// other clone holds it, laya's primitives may write into the buffers in place (MLX's own
    /// test for that, a buffer held by nothing else, never passes for an input of a primitive
    /// with several outputs: each output holds the inputs).
    owner: std::sync::Arc<()>,
}

/// Checkpoints a recurrent layer keeps at most (besides the state before its last update and
/// the one at its prompt's end).
pub(crate) const KEPT: usize = 3;

/// A Gated DeltaNet layer's state: the convolution's last inputs `[B, kernel - 1, channels]`
/// and the recurrence's state `[B, value_heads, value_dim, key_dim]` (f32).
#[derive(Clone)]
pub(crate) struct Recurrent {
    pub(crate) conv: Array,
    pub(crate) state: Array,
}

impl Recurrent {
    fn arrays(&self) -> [&Array; 2] {
        [&self.conv, &self.state]
    }
}

impl KvCache {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether no clone of this cache holds its buffers: a write may then go into them in place.
    fn exclusive(&self) -> bool {
        std::sync::Arc::strong_count(&self.owner) == 1
    }

    /// Positions held (the next token's position).
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// Positions the buffers can hold before they grow.
    pub(crate) fn capacity(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.dim(2) as usize)
    }

    /// Batch size of the buffers, `None` while empty.
    pub(crate) fn batch_size(&self) -> Option<i32> {
        match &self.recurrent {
            Some(r) => Some(r.conv.dim(0)),
            None => self.keys.as_ref().map(|k| k.dim(0)),
        }
    }

    /// A recurrent layer's state, `None` before its first update (a zero state).
    pub(crate) fn recurrent(&self) -> Option<&Recurrent> {
        self.recurrent.as_ref()
    }

    /// A recurrent layer's state after `len` more positions; the state it replaces becomes
    /// the checkpoint.
    pub(crate) fn update_recurrent(&mut self, next: Recurrent, len: usize) -> Result<()> {
        if self.keys.is_some() {
            return Err(Exception::custom(
                "kv cache: keys and a recurrent state in one layer",
            ));
        }
        self.previous = self.recurrent.replace(next).map(|prev| (self.offset, prev));
        self.offset += len;
        Ok(())
    }

    /// Keeps a recurrent layer's state at its offset as a checkpoint (nothing for keys and
    /// values, nor at offset 0). Past [`KEPT`] checkpoints, the one whose neighbours are
    /// closest goes (never the newest): they stay spread over the prompt.
    pub(crate) fn keep(&mut self) {
        let Some(state) = &self.recurrent else { return };
        if self.offset == 0 || self.kept.last().is_some_and(|(at, _)| *at >= self.offset) {
            return;
        }
        self.kept.push((self.offset, state.clone()));
        if self.kept.len() > KEPT {
            // The gap left where checkpoint `i` goes.
            let gap = |i: usize| self.kept[i + 1].0 - if i == 0 { 0 } else { self.kept[i - 1].0 };
            let closest = (0..self.kept.len() - 1)
                .min_by_key(|&i| gap(i))
                .expect("two or more");
            self.kept.remove(closest);
        }
    }

    /// Keeps a recurrent layer's state at its offset as the prompt's end (nothing for keys and
    /// values), in place of the last prompt's.
    pub(crate) fn keep_end(&mut self) {
        if let Some(state) = self.recurrent.as_ref().filter(|_| self.offset > 0) {
            self.end = Some((self.offset, state.clone()));
        }
    }

    /// The states besides the current one: before the last update, kept, at the prompt's end.
    fn saved(&self) -> impl Iterator<Item = &(usize, Recurrent)> {
        self.previous.iter().chain(&self.kept).chain(&self.end)
    }

    /// Drops the state before the last update (a store keeps only chosen checkpoints).
    pub(crate) fn forget_previous(&mut self) {
        self.previous = None;
    }

    /// Lengths below the offset this cache can go back to (a recurrent layer's checkpoints).
    #[cfg(test)]
    pub(crate) fn checkpoints(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.saved().map(|(at, _)| *at).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The longest length at most `len` this cache can be cut back to: `len` (at most the
    /// offset) for keys and values; for a recurrent state the offset, a checkpoint's offset
    /// or 0, whichever is the longest not past `len`.
    pub(crate) fn restorable(&self, len: usize) -> usize {
        if self.recurrent.is_none() {
            return len.min(self.offset);
        }
        if self.offset <= len {
            return self.offset;
        }
        self.saved()
            .map(|(at, _)| *at)
            .filter(|&at| at <= len)
            .max()
            .unwrap_or(0)
    }

    /// Appends `keys`/`values` (`[B, kv_heads, L, head_dim]`) at `offset` and returns all
    /// keys and values so far, `[B, kv_heads, offset + L, head_dim]`.
    pub(crate) fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if keys.ndim() != 4 || keys.shape() != values.shape() {
            return Err(Exception::custom(format!(
                "kv cache: keys {:?} and values {:?} must be the same [B, heads, L, head_dim]",
                keys.shape(),
                values.shape()
            )));
        }
        let prev = self.reserve(keys.shape(), (keys.dtype(), values.dtype()))?;
        // One `SliceUpdate` each (mlx-rs's `try_index_mut` would reshape the update twice).
        let at = [0, 0, prev, 0];
        let (k_buf, v_buf) = self.buffers_mut();
        *k_buf = slice_update(k_buf, keys, &at)?;
        *v_buf = slice_update(v_buf, values, &at)?;
        self.offset = (prev + keys.dim(2)) as usize;
        self.fetch()
    }

    /// As [`update_and_fetch`](Self::update_and_fetch) for new keys and values of `shape`
    /// `[b, kv_heads, len, head_dim]` and `dtype`, where `write` makes the new buffers: it
    /// gets the buffers (grown to hold them), the offset and whether it may write into them in
    /// place (no clone of the cache holds them; else it writes into copies), and returns the
    /// buffers with those positions written and views of the first `offset + len`.
    pub(crate) fn update_in_place(
        &mut self,
        shape: [i32; 4],
        dtype: mlx_rs::Dtype,
        write: impl FnOnce(&Array, &Array, i32, bool) -> Result<[Array; 4]>,
    ) -> Result<(Array, Array)> {
        update_all_in_place(std::slice::from_mut(self), shape, dtype, |bufs, at, in_place| {
            let [k_buf, v_buf, keys, values] = write(&bufs[0], &bufs[1], at, in_place[0])?;
            Ok(((keys, values), vec![k_buf, v_buf]))
        })
    }

    /// Makes room for new keys and values of `shape` `[B, kv_heads, L, head_dim]` (their
    /// dtypes for buffers made here) after checking they belong in this layer's buffers; the
    /// offset they go at.
    fn reserve(&mut self, shape: &[i32], (k_dtype, v_dtype): (mlx_rs::Dtype, mlx_rs::Dtype)) -> Result<i32> {
        if self.recurrent.is_some() {
            return Err(Exception::custom(
                "kv cache: keys and a recurrent state in one layer",
            ));
        }
        if let Some(buf) = &self.keys {
            let have = buf.shape();
            if (have[0], have[1], have[3]) != (shape[0], shape[1], shape[3]) {
                return Err(Exception::custom(format!(
                    "kv cache holds [B, heads, _, head_dim] = {have:?}, got {shape:?}"
                )));
            }
        }
        let prev = self.offset as i32;
        if prev + shape[2] > self.capacity() as i32 {
            let grow = (shape[2] + STEP - 1) / STEP * STEP;
            self.keys = Some(grown(self.keys.take(), shape, k_dtype, prev, grow)?);
            self.values = Some(grown(self.values.take(), shape, v_dtype, prev, grow)?);
            // New buffers, this cache's own.
            self.owner = std::sync::Arc::new(());
        }
        Ok(prev)
    }

    /// Drops the last `n` positions (at most `offset`); returns how many were dropped.
    #[cfg(test)]
    pub(crate) fn trim(&mut self, n: usize) -> usize {
        let n = n.min(self.offset);
        self.offset -= n;
        n
    }

    /// Keeps at most the first `len` positions. A recurrent state goes back to
    /// [`KvCache::restorable`]`(len)`, which is shorter than `len` unless `len` is a length it
    /// holds a state of: cut a model's caches with [`rewind`], which keeps them in step.
    pub(crate) fn truncate_to(&mut self, len: usize) {
        if self.recurrent.is_none() || len >= self.offset {
            self.offset = self.offset.min(len);
            return;
        }
        // `to` is a checkpoint's offset or 0 (a fresh, zero state).
        let to = self.restorable(len);
        self.previous = self.previous.take().filter(|(at, _)| *at <= to);
        self.kept.retain(|(at, _)| *at <= to);
        self.end = self.end.take().filter(|(at, _)| *at <= to);
        let restored = self
            .saved()
            .find(|(at, _)| *at == to && to > 0)
            .map(|(_, state)| state.clone());
        self.recurrent = restored;
        self.previous = self.previous.take().filter(|(at, _)| *at < to);
        self.offset = to;
    }

    /// Bytes held by the buffers (whole capacity, like mlx-lm) and recurrent states (a state
    /// saved under two names, as the one before the last update and a kept one, once).
    pub(crate) fn nbytes(&self) -> usize {
        let mut seen = vec![];
        let saved = self.saved().filter(|(at, _)| {
            let new = !seen.contains(at);
            seen.push(*at);
            new
        });
        let saved = saved.flat_map(|(_, r)| r.arrays());
        self.arrays().chain(saved).map(Array::nbytes).sum()
    }

    /// The buffers or the recurrent state, to evaluate after a prefill chunk.
    pub(crate) fn arrays(&self) -> impl Iterator<Item = &Array> {
        let recurrent = self.recurrent.iter().flat_map(Recurrent::arrays);
        self.keys.iter().chain(self.values.iter()).chain(recurrent)
    }

    /// The valid keys and values, `[B, kv_heads, offset, head_dim]`; `None` while empty.
    #[cfg(test)]
    pub(crate) fn state(&self) -> Option<(Array, Array)> {
        if self.offset == 0 {
            return None;
        }
        self.fetch().ok()
    }

    /// A cache of batch `n` whose every row is this (batch-1) cache: candidates share one
    /// prefill of the prompt. The rows are real copies (not a broadcast view).
    pub(crate) fn repeat(&self, n: i32) -> Result<KvCache> {
        let rep = |a: &Option<Array>| -> Result<Option<Array>> {
            let Some(a) = a else { return Ok(None) };
            if a.dim(0) != 1 {
                return Err(Exception::custom(format!(
                    "kv cache repeat: batch must be 1, is {}",
                    a.dim(0)
                )));
            }
            let mut shape = a.shape().to_vec();
            shape[0] = n;
            broadcast_to(a, &shape)?.contiguous().map(Some)
        };
        let recurrent = match &self.recurrent {
            Some(r) => Some(Recurrent {
                conv: rep(&Some(r.conv.clone()))?.expect("a state"),
                state: rep(&Some(r.state.clone()))?.expect("a state"),
            }),
            None => None,
        };
        Ok(KvCache {
            keys: rep(&self.keys)?,
            values: rep(&self.values)?,
            offset: self.offset,
            recurrent,
            previous: None,
            kept: vec![],
            end: None,
            // One row may be this cache's own buffers (an already contiguous array is not
            // copied): shared then.
            owner: if n == 1 {
                self.owner.clone()
            } else {
                std::sync::Arc::new(())
            },
        })
    }

    /// The first `offset` positions: a view of the buffers, no copy (attention reads strided
    /// keys and values; `mlx_ops::attention_of_one_query_at_small_and_real_head_sizes` checks
    /// that on each backend).
    fn fetch(&self) -> Result<(Array, Array)> {
        let end = self.offset as i32;
        let view = |a: &Array| -> Result<Array> {
            if a.dim(2) == end {
                Ok(a.clone())
            } else {
                a.try_index((.., .., ..end, ..))
            }
        };
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Ok((view(k)?, view(v)?)),
            _ => Err(Exception::custom("kv cache is empty")),
        }
    }

    fn buffers_mut(&mut self) -> (&mut Array, &mut Array) {
        match (&mut self.keys, &mut self.values) {
            (Some(k), Some(v)) => (k, v),
            _ => unreachable!("buffers exist after growing"),
        }
    }
}

/// The longest length at most `len` that every one of a model's `caches` can go back to.
pub(crate) fn restorable(caches: &[KvCache], len: usize) -> usize {
    caches.iter().map(|c| c.restorable(len)).min().unwrap_or(len)
}

/// Keeps every recurrent layer's state at its offset as a checkpoint ([`KvCache::keep`]).
pub(crate) fn checkpoint(caches: &mut [KvCache]) {
    caches.iter_mut().for_each(KvCache::keep);
}

/// Keeps every recurrent layer's state at its offset as the prompt's end
/// ([`KvCache::keep_end`]).
pub(crate) fn checkpoint_end(caches: &mut [KvCache]) {
    caches.iter_mut().for_each(KvCache::keep_end);
}

/// Cuts a model's `caches` back to [`restorable`]`(caches, len)`, every layer to the same
/// length, and returns it: never a recurrent state of one length beside keys of another.
pub(crate) fn rewind(caches: &mut [KvCache], len: usize) -> usize {
    let to = restorable(caches, len);
    caches.iter_mut().for_each(|c| c.truncate_to(to));
    to
}

/// [`KvCache::update_in_place`] for every layer of a model at once (laya's whole decode step;
/// one layer's update is this over one cache):
/// `write` gets each layer's buffers (k, then v, a layer), grown to hold new keys and values
/// of `shape`, the offset and whether each layer's may be written in place, and returns its
/// result with the written buffers in the same order. On an error every cache holds what it
/// held.
pub(crate) fn update_all_in_place<R>(
    caches: &mut [KvCache],
    shape: [i32; 4],
    dtype: mlx_rs::Dtype,
    write: impl FnOnce(&[Array], i32, &[bool]) -> Result<(R, Vec<Array>)>,
) -> Result<R> {
    let offset = caches.first().map_or(0, KvCache::offset);
    if caches.iter().any(|c| c.offset != offset) {
        return Err(Exception::custom("kv cache: layers at different offsets"));
    }
    let mut bufs = Vec::with_capacity(2 * caches.len());
    for c in caches.iter_mut() {
        c.reserve(&shape, (dtype, dtype))?;
    }
    let in_place: Vec<bool> = caches.iter().map(KvCache::exclusive).collect();
    for c in caches.iter_mut() {
        let (Some(k), Some(v)) = (c.keys.take(), c.values.take()) else {
            unreachable!("buffers exist after growing");
        };
        bufs.extend([k, v]);
    }
    match write(&bufs, offset as i32, &in_place) {
        Ok((out, written)) if written.len() == bufs.len() => {
            for ((c, kv), own) in caches.iter_mut().zip(written.chunks_exact(2)).zip(&in_place) {
                c.keys = Some(kv[0].clone());
                c.values = Some(kv[1].clone());
                c.offset = offset + shape[2] as usize;
                if !own {
                    c.owner = std::sync::Arc::new(());
                }
            }
            Ok(out)
        }
        result => {
            let mut old = bufs.into_iter();
            for c in caches.iter_mut() {
                c.keys = old.next();
                c.values = old.next();
            }
            match result {
                Err(e) => Err(e),
                Ok(_) => Err(Exception::custom("kv cache: a write gave back too few buffers")),
            }
        }
    }
}

/// `buf` (valid up to `prev`) with `grow` more positions of new keys or values `shape` (`dtype`).
fn grown(buf: Option<Array>, shape: &[i32], dtype: mlx_rs::Dtype, prev: i32, grow: i32) -> Result<Array> {
    let mut shape = shape.to_vec();
    shape[2] = grow;
    let extra = zeros_dtype(&shape, dtype)?;
    match buf {
        None => Ok(extra),
        Some(buf) => {
            // Stale positions past `prev` (after a trim) are dropped rather than carried.
            let kept = if buf.dim(2) == prev {
                buf
            } else {
                buf.try_index((.., .., ..prev, ..))?
            };
            concatenate(&[kept, extra], 2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(b: i32, l: i32, start: f32) -> Array {
        let n = (b * 2 * l * 4) as usize;
        let v: Vec<f32> = (0..n).map(|i| start + i as f32).collect();
        Array::from_slice(&v, &[b, 2, l, 4])
    }

    #[test]
    fn nbytes_grows_in_steps() {
        let mut c = KvCache::new();
        assert_eq!((c.nbytes(), c.capacity()), (0, 0));
        let per_step = 2 * (2 * STEP as usize * 4 * 4); // k and v, f32
        c.update_and_fetch(&kv(1, 1, 0.0), &kv(1, 1, 0.0)).unwrap();
        assert_eq!(c.nbytes(), per_step);
        c.update_and_fetch(&kv(1, 255, 0.0), &kv(1, 255, 0.0)).unwrap();
        assert_eq!((c.offset(), c.nbytes()), (256, per_step));
        c.update_and_fetch(&kv(1, 1, 0.0), &kv(1, 1, 0.0)).unwrap();
        assert_eq!((c.offset(), c.nbytes()), (257, 2 * per_step));
        // A chunk larger than a step grows by whole steps at once.
        c.update_and_fetch(&kv(1, 600, 0.0), &kv(1, 600, 0.0)).unwrap();
        assert_eq!((c.offset(), c.capacity()), (857, 257 + 768));
    }

    #[test]
    fn fetch_returns_everything_written_in_order() {
        let mut c = KvCache::new();
        let (a, b) = (kv(2, 3, 0.0), kv(2, 2, 1000.0));
        c.update_and_fetch(&a, &a).unwrap();
        let (k, v) = c.update_and_fetch(&b, &b).unwrap();
        let want = concatenate(&[&a, &b], 2).unwrap();
        assert_eq!(k.shape(), &[2, 2, 5, 4]);
        assert!(k.eq_values(&want).unwrap());
        assert!(v.eq_values(&want).unwrap());
    }

    #[test]
    fn trim_returns_what_it_trimmed_and_overwrites() {
        let mut c = KvCache::new();
        let a = kv(1, 5, 0.0);
        c.update_and_fetch(&a, &a).unwrap();
        assert_eq!(c.trim(2), 2);
        assert_eq!(c.offset(), 3);
        assert_eq!(c.trim(10), 3);
        assert_eq!(c.offset(), 0);
        assert!(c.state().is_none());
        c.update_and_fetch(&a, &a).unwrap();
        c.truncate_to(4);
        assert_eq!(c.offset(), 4);
        c.truncate_to(9);
        assert_eq!(c.offset(), 4);
        let b = kv(1, 1, 500.0);
        let (k, _) = c.update_and_fetch(&b, &b).unwrap();
        let want = concatenate(&[&a.try_index((.., .., ..4, ..)).unwrap(), &b], 2).unwrap();
        assert!(k.eq_values(&want).unwrap());
    }

    #[test]
    fn clones_and_repeats_are_independent() {
        let mut c = KvCache::new();
        let a = kv(1, 3, 0.0);
        c.update_and_fetch(&a, &a).unwrap();
        let snapshot = c.clone();
        let mut wide = c.repeat(3).unwrap();
        assert_eq!((wide.batch_size(), wide.offset()), (Some(3), 3));
        let (k, _) = wide.update_and_fetch(&kv(3, 1, 100.0), &kv(3, 1, 100.0)).unwrap();
        assert_eq!(k.shape(), &[3, 2, 4, 4]);
        let b = kv(1, 1, 7.0);
        c.update_and_fetch(&b, &b).unwrap();
        let (k0, _) = snapshot.state().unwrap();
        assert!(k0.eq_values(&a).unwrap());
        assert_eq!(c.offset(), 4);
        assert!(c.repeat(2).unwrap().repeat(2).is_err());
        // A batch mismatch is an error, not a crash.
        assert!(c.update_and_fetch(&kv(2, 1, 0.0), &kv(2, 1, 0.0)).is_err());
    }
}
