//! The worker threads: one rayon pool per process.
//!
//! Not rayon's global pool: `Store.verify` forks worker processes, and a forked child
//! inherits the parent's pool without its threads, so work sent to it would never run.
//! Here a child (another process id) builds a pool of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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

/// Run `task(i)` for every `i` in `0..count`, on the calling thread and on the pool's other
/// threads, each taking the next index not yet taken; return when every task has run.
///
/// The calling thread works from the start rather than waiting for the pool: a sleeping
/// worker takes tens of microseconds or more to wake, a good part of a job of one or two
/// milliseconds, and whatever it misses the caller has done. On a pool thread (work nested
/// in a task) the tasks run where they are.
pub fn share(count: usize, task: impl Fn(usize) + Sync) {
    let helpers = if count < 2 || rayon::current_thread_index().is_some() {
        0
    } else {
        available() - 1
    };
    let next = AtomicUsize::new(0);
    let run = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= count {
            break;
        }
        task(i);
    };
    if helpers == 0 {
        run();
        return;
    }
    current().in_place_scope(|scope| {
        for _ in 0..helpers.min(count - 1) {
            scope.spawn(|_| run());
        }
        run();
    });
}

/// Return how many threads may hash at once: the pool's, which is one per core.
fn available() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| current().current_num_threads().max(1))
}

/// Split `out` into pieces of `per` and run `task(i, piece_i)` on each as [`share`] does.
pub fn share_chunks_mut<T: Send>(out: &mut [T], per: usize, task: impl Fn(usize, &mut [T]) + Sync) {
    // Each piece behind its own lock, taken once by whichever thread claims its index.
    let pieces: Vec<Mutex<&mut [T]>> = out.chunks_mut(per.max(1)).map(Mutex::new).collect();
    share(pieces.len(), |i| {
        let mut piece = pieces[i].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        task(i, &mut piece);
    });
}

/// Return `task(i)` for every `i` in `0..count`, in order, computed as [`share`] does.
pub fn share_map<R: Send>(count: usize, task: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let slots: Vec<Mutex<Option<R>>> = (0..count).map(|_| Mutex::new(None)).collect();
    share(count, |i| {
        let r = task(i);
        *slots[i].lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(r);
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .expect("every task ran")
        })
        .collect()
}
