//! Fair queueing per model: each model (lane) runs a fixed number of requests at a time
//! (one for a local model, whose worker runs one at a time anyway); waiting requests are
//! taken round-robin across clients, so one client with many requests cannot starve the
//! others. A waiter that gives up (its future is dropped) leaves the queue.

use std::{
    collections::{HashMap, VecDeque},
    hash::Hash,
    sync::{Arc, Mutex},
};

use tokio::sync::oneshot;

/// More waiting requests than this from one client on one lane are refused.
pub const MAX_WAITING_PER_CLIENT: usize = 16;

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct Busy(pub String);

struct LaneState {
    slots: usize,
    running: usize,
    /// Clients with waiters, in turn order.
    order: VecDeque<String>,
    waiting: HashMap<String, VecDeque<oneshot::Sender<()>>>,
}

impl LaneState {
    /// Hand free slots to waiters, one client at a time in turn.
    fn dispatch(&mut self) {
        while self.running < self.slots {
            let Some(client) = self.order.pop_front() else {
                return;
            };
            let Some(q) = self.waiting.get_mut(&client) else {
                continue;
            };
            let mut handed = false;
            while let Some(tx) = q.pop_front() {
                if tx.send(()).is_ok() {
                    handed = true;
                    break;
                }
                // That waiter gave up; try the client's next one.
            }
            if q.is_empty() {
                self.waiting.remove(&client);
            } else {
                self.order.push_back(client);
            }
            if handed {
                self.running += 1;
            }
        }
    }

    fn waiting(&self) -> usize {
        self.waiting
            .values()
            .map(|q| q.iter().filter(|t| !t.is_closed()).count())
            .sum()
    }
}

pub struct FairQueue<L> {
    lanes: Mutex<HashMap<L, LaneState>>,
}

impl<L> Default for FairQueue<L> {
    fn default() -> Self {
        FairQueue {
            lanes: Mutex::new(HashMap::new()),
        }
    }
}

/// A running slot of a lane; dropping it lets the next waiter run.
pub struct Permit<L: Eq + Hash + Clone> {
    queue: Arc<FairQueue<L>>,
    lane: L,
}

impl<L: Eq + Hash + Clone> Drop for Permit<L> {
    fn drop(&mut self) {
        self.queue.release(&self.lane);
    }
}

/// A waiter in line; if it is dropped after a slot was handed to it but before it took it,
/// the slot goes on to the next waiter.
struct Waiting<L: Eq + Hash + Clone> {
    queue: Arc<FairQueue<L>>,
    lane: L,
    rx: Option<oneshot::Receiver<()>>,
}

impl<L: Eq + Hash + Clone> Drop for Waiting<L> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.queue.release(&self.lane);
            }
        }
    }
}

impl<L: Eq + Hash + Clone> FairQueue<L> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<L, LaneState>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for a slot of `lane` (which runs `slots` requests at a time) as `client`.
    pub async fn acquire(self: &Arc<Self>, lane: L, slots: usize, client: &str) -> Result<Permit<L>, Busy> {
        let rx = {
            let mut lanes = self.lock();
            let st = lanes.entry(lane.clone()).or_insert_with(|| LaneState {
                slots: slots.max(1),
                running: 0,
                order: VecDeque::new(),
                waiting: HashMap::new(),
            });
            st.slots = slots.max(1);
            if st.running < st.slots && st.order.is_empty() {
                st.running += 1;
                return Ok(Permit {
                    queue: self.clone(),
                    lane,
                });
            }
            let q = st.waiting.entry(client.to_owned()).or_default();
            q.retain(|t| !t.is_closed());
            if q.len() >= MAX_WAITING_PER_CLIENT {
                return Err(Busy(format!(
                    "too many requests waiting from this client ({MAX_WAITING_PER_CLIENT}); retry later"
                )));
            }
            let (tx, rx) = oneshot::channel();
            q.push_back(tx);
            if !st.order.iter().any(|c| c == client) {
                st.order.push_back(client.to_owned());
            }
            rx
        };
        let mut waiting = Waiting {
            queue: self.clone(),
            lane: lane.clone(),
            rx: Some(rx),
        };
        let got = waiting.rx.as_mut().expect("set above").await;
        waiting.rx = None;
        match got {
            Ok(()) => Ok(Permit {
                queue: self.clone(),
                lane,
            }),
            // The queue itself never drops a live sender; treat it as a refusal.
            Err(_) => Err(Busy("the queue was reset".into())),
        }
    }

    fn release(&self, lane: &L) {
        let mut lanes = self.lock();
        if let Some(st) = lanes.get_mut(lane) {
            st.running = st.running.saturating_sub(1);
            st.dispatch();
        }
    }

    /// (running, waiting) over all lanes.
    pub fn counts(&self) -> (usize, usize) {
        let lanes = self.lock();
        lanes
            .values()
            .fold((0, 0), |(r, w), st| (r + st.running, w + st.waiting()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Clients a (5 requests queued first) and b (2 queued after) on one slot: the order of
    /// service alternates instead of serving all of a's first.
    #[tokio::test]
    async fn waiters_are_served_round_robin_across_clients() {
        let q = Arc::new(FairQueue::<u8>::default());
        let first = q.acquire(0, 1, "a").await.unwrap();
        let served = Arc::new(Mutex::new(vec![]));
        let mut tasks = vec![];
        for (client, i) in [("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 1), ("b", 2)] {
            let (q, served) = (q.clone(), served.clone());
            tasks.push(tokio::spawn(async move {
                let _p = q.acquire(0, 1, client).await.unwrap();
                served.lock().unwrap().push(format!("{client}{i}"));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }));
            tokio::time::sleep(Duration::from_millis(5)).await; // queue in this order
        }
        assert_eq!(q.counts(), (1, 6));
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*served.lock().unwrap(), ["a1", "b1", "a2", "b2", "a3", "a4"]);
        assert_eq!(q.counts(), (0, 0));
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_the_line_and_slots_are_not_lost() {
        let q = Arc::new(FairQueue::<u8>::default());
        let p = q.acquire(0, 1, "a").await.unwrap();
        let gave_up = tokio::time::timeout(Duration::from_millis(20), q.acquire(0, 1, "b")).await;
        assert!(gave_up.is_err());
        drop(p);
        // The slot is free again: no waiter holds it.
        let p = tokio::time::timeout(Duration::from_millis(100), q.acquire(0, 1, "c"))
            .await
            .expect("slot free")
            .unwrap();
        assert_eq!(q.counts(), (1, 0));
        drop(p);
        // Lanes are independent, and a lane may run several at once.
        let _x = q.acquire(1, 2, "a").await.unwrap();
        let _y = q.acquire(1, 2, "a").await.unwrap();
        assert_eq!(q.counts(), (2, 0));
    }

    #[tokio::test]
    async fn one_client_cannot_queue_without_bound() {
        let q = Arc::new(FairQueue::<u8>::default());
        let _p = q.acquire(0, 1, "a").await.unwrap();
        let mut held = vec![];
        for _ in 0..MAX_WAITING_PER_CLIENT {
            let q = q.clone();
            held.push(tokio::spawn(
                async move { q.acquire(0, 1, "a").await.map(|_| ()) },
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let err = q.acquire(0, 1, "a").await.err().unwrap();
        assert!(err.0.contains("too many"), "{err}");
        // Another client still gets in line.
        let other = tokio::time::timeout(Duration::from_millis(20), q.acquire(0, 1, "b")).await;
        assert!(other.is_err(), "b waits its turn rather than being refused");
        for h in held {
            h.abort();
        }
    }
}
