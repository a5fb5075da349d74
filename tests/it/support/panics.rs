//! Panics counted per test. A panic in a task whose result nobody reads shows nowhere but
//! in the panic hook; the hook is the process's, and the other tests of this binary run
//! beside the one that counts (a failing assertion of theirs is a panic too). So the hook is
//! installed once, chains to the one it replaces, and counts a panic only for the test that
//! owns the thread it happens on: the test's own thread, the threads of the runtime
//! [`no_panics`] runs it on, and the threads started from those with [`spawn`].

use std::{
    cell::RefCell,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Once,
    },
};

thread_local! {
    /// The count of the test that owns this thread, if one counts.
    static OWNER: RefCell<Option<Arc<AtomicUsize>>> = const { RefCell::new(None) };
}

fn own(count: Option<Arc<AtomicUsize>>) {
    OWNER.with(|o| *o.borrow_mut() = count);
}

fn owner() -> Option<Arc<AtomicUsize>> {
    OWNER.with(|o| o.borrow().clone())
}

/// The panics of one test's threads.
struct Panics(Arc<AtomicUsize>);

impl Panics {
    /// Counts the panics of this thread from now on (until dropped).
    fn watch() -> Panics {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let _ = OWNER.try_with(|o| {
                    if let Ok(Some(count)) = o.try_borrow().as_deref() {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                });
                previous(info);
            }));
        });
        let count = Arc::new(AtomicUsize::new(0));
        own(Some(count.clone()));
        Panics(count)
    }

    /// A multi-thread tokio runtime of `workers` workers whose threads (workers and blocking
    /// ones) count here.
    fn runtime(&self, workers: usize) -> tokio::runtime::Runtime {
        let count = self.0.clone();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .on_thread_start(move || own(Some(count.clone())))
            .build()
            .unwrap()
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for Panics {
    fn drop(&mut self) {
        own(None);
    }
}

/// Runs `test` on a runtime of `workers` workers and fails if a thread of this test panicked
/// meanwhile, also where nobody reads the panic (a task whose result is dropped).
pub fn no_panics<F: std::future::Future>(workers: usize, test: F) -> F::Output {
    let panics = Panics::watch();
    let out = panics.runtime(workers).block_on(test);
    assert_eq!(panics.count(), 0, "a panic happened");
    out
}

/// `std::thread::spawn`, the new thread's panics counted where this thread's are.
pub fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    let count = owner();
    std::thread::spawn(move || {
        own(count);
        f()
    })
}
