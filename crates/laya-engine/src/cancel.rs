//! [`Cancel`]: how a request is stopped, the one type every layer shares. Every `Engine` call
//! takes one.
//!
//! Set by whoever gives up on a request: the LSP layer (a newer request that supersedes one
//! for the same document, `didClose`, `shutdown`), the daemon when a client's connection closes
//! or its HTTP stream is dropped, and a [`CancelOnDrop`] guard when a request's future is
//! dropped (the local worker and the remote engine hold one across their await).
//!
//! Read by whoever does the work: the model thread before each prompt chunk and decode step
//! and before a queued job starts ([`Cancel::is_cancelled`], one atomic load, never a host
//! sync); the remote engine's blocking call, which then closes its connection; the daemon
//! between queue and engine; and async code awaiting [`Cancel::cancelled`] (the LSP debounce,
//! `DaemonEngine`'s exchange), which wakes when it is set, with no polling.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use tokio::sync::Notify;

/// A shared cancellation flag: clones share it; once set it stays set.
#[derive(Clone, Default)]
pub struct Cancel(Arc<Inner>);

#[derive(Default)]
struct Inner {
    flag: AtomicBool,
    wake: Notify,
}

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Set the flag and wake every [`cancelled`](Self::cancelled) waiter.
    pub fn cancel(&self) {
        // The flag before the wake-up: a waiter that registered and then saw it unset is
        // woken by this `notify_waiters`.
        if !self.0.flag.swap(true, Ordering::SeqCst) {
            self.0.wake.notify_waiters();
        }
    }

    /// Whether [`cancel`](Self::cancel) was called on this or a clone: one atomic load.
    pub fn is_cancelled(&self) -> bool {
        self.0.flag.load(Ordering::Relaxed)
    }

    /// Completes once the flag is set (at once if it already is).
    pub async fn cancelled(&self) {
        loop {
            let notified = self.0.wake.notified();
            tokio::pin!(notified);
            // Register before reading the flag, so a `cancel` between the two is not missed.
            notified.as_mut().enable();
            if self.0.flag.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// A guard that cancels this flag when dropped, unless disarmed (`CancelOnDrop::disarm`)
    /// first: held across an await whose future may be dropped (the caller gave up), so
    /// that the work it started stops too.
    pub fn guard(&self) -> CancelOnDrop {
        CancelOnDrop(Some(self.clone()))
    }

    /// Whether `self` and `other` are clones of one flag.
    pub fn same(&self, other: &Cancel) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Cancel").field(&self.is_cancelled()).finish()
    }
}

/// Cancels its [`Cancel`] when dropped, unless disarmed; see [`Cancel::guard`].
#[must_use = "the guard cancels when dropped: bind it to a variable"]
pub struct CancelOnDrop(Option<Cancel>);

impl CancelOnDrop {
    /// The work finished: dropping the guard no longer cancels.
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Waits for `c.cancelled()` at most a second: `true` when it completed.
    async fn wakes(c: &Cancel) -> bool {
        tokio::time::timeout(Duration::from_secs(1), c.cancelled())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn cancel_wakes_a_waiter_registered_before_it() {
        let c = Cancel::new();
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { wakes(&c).await }
        });
        // Let the waiter register first.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished(), "nothing wakes it before the cancel");
        c.cancel();
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn a_waiter_registered_after_the_cancel_completes_at_once() {
        let c = Cancel::new();
        c.cancel();
        assert!(wakes(&c).await);
        assert!(wakes(&c.clone()).await, "and on every clone");
    }

    #[tokio::test]
    async fn an_uncancelled_flag_does_not_wake_its_waiter() {
        let c = Cancel::new();
        let waited = tokio::time::timeout(Duration::from_millis(50), c.cancelled()).await;
        assert!(waited.is_err());
        assert!(!c.is_cancelled());
    }

    #[test]
    fn a_cancel_from_another_thread_wakes_many_waiters() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        for _ in 0..200 {
            let c = Cancel::new();
            let waiters: Vec<_> = (0..4)
                .map(|_| {
                    let c = c.clone();
                    rt.spawn(async move { wakes(&c).await })
                })
                .collect();
            let setter = std::thread::spawn({
                let c = c.clone();
                move || c.cancel()
            });
            setter.join().unwrap();
            for w in waiters {
                assert!(rt.block_on(w).unwrap(), "a waiter missed the cancel");
            }
        }
    }

    #[test]
    fn clones_share_the_flag() {
        let a = Cancel::new();
        let b = a.clone();
        assert!(a.same(&b) && !a.same(&Cancel::new()));
        assert!(!a.is_cancelled() && !b.is_cancelled());
        b.cancel();
        assert!(a.is_cancelled());
        assert!(!Cancel::new().is_cancelled(), "a new flag is its own");
    }

    #[test]
    fn the_guard_cancels_on_drop_unless_disarmed() {
        let c = Cancel::new();
        drop(c.guard());
        assert!(c.is_cancelled());

        let c = Cancel::new();
        let mut g = c.guard();
        g.disarm();
        drop(g);
        assert!(!c.is_cancelled());
    }

    #[tokio::test]
    async fn a_dropped_future_holding_the_guard_cancels() {
        let c = Cancel::new();
        let work = {
            let c = c.clone();
            async move {
                let _guard = c.guard();
                std::future::pending::<()>().await;
            }
        };
        // Polled once (the guard is taken), then dropped, as a caller that gave up does.
        let timed_out = tokio::time::timeout(Duration::from_millis(10), work).await;
        assert!(timed_out.is_err());
        assert!(c.is_cancelled());
        assert!(wakes(&c).await);
    }
}
