//! The worker threads: one rayon pool per process.
//!
//! Not rayon's global pool: `Store.verify` forks worker processes, and a forked child
//! inherits the parent's pool without its threads, so work sent to it would never run.
//! Here a child (another process id) builds a pool of its own.

use std::sync::{Arc, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

static POOL: Mutex<Option<(u32, Arc<ThreadPool>)>> = Mutex::new(None);

fn current() -> Arc<ThreadPool> {
    let pid = std::process::id();
    let mut slot = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((owner, pool)) = slot.as_ref() {
        if *owner == pid {
            return Arc::clone(pool);
        }
    }
    let pool = Arc::new(
        ThreadPoolBuilder::new()
            .thread_name(|i| format!("compactstore-hash-{i}"))
            .build()
            .expect("start the hashing threads"),
    );
    if let Some(inherited) = slot.replace((pid, Arc::clone(&pool))) {
        // A forked parent's pool: its threads are not in this process, so dropping it
        // would wait for them forever.
        std::mem::forget(inherited);
    }
    pool
}

/// Run `f` in this process's pool (directly when already on one of its threads).
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    current().install(f)
}
