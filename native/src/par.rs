//! Work spread over this process's cores with scoped threads (`std::thread::scope`).
//!
//! Each call starts its own threads and joins them before it returns: nothing outlives the
//! data it borrows, and no pool is left for a forked child to inherit without its threads
//! (`Store.verify` forks worker processes from a parent whose other threads may be hashing).

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// The cores this process may run on, once read (0: not yet).
///
/// An atomic, not a `OnceLock`: a child forked while another thread fills a `OnceLock`
/// would wait on it forever. Reading the count asks the kernel (affinity and cgroup quota).
static CORES: AtomicUsize = AtomicUsize::new(0);

/// Return how many threads may work at once: one per core this process may run on.
pub fn threads() -> usize {
    match CORES.load(Ordering::Relaxed) {
        0 => {
            let n = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
            CORES.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

/// Run `task(i)` for every `i` in `0..count`, on the calling thread and on up to
/// `threads() - 1` scoped threads, each taking the next index not yet taken; return when
/// every task has run. A panic in a task reaches the caller once every thread has stopped.
///
/// The calling thread works from the start, so a helper that waits for a core on a busy
/// machine only takes fewer tasks; but the call returns only once every helper has stopped,
/// so there it also waits for a helper the scheduler has not run yet to start and find
/// nothing left. A helper the system refuses to start is done without.
pub fn each(count: usize, task: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= count {
            break;
        }
        task(i);
    };
    let helpers = threads().min(count).saturating_sub(1);
    if helpers == 0 {
        return work();
    }
    std::thread::scope(|s| {
        for _ in 0..helpers {
            if std::thread::Builder::new().spawn_scoped(s, work).is_err() {
                break;
            }
        }
        work();
    });
}

/// Return `task(i)` for every `i` in `0..count`, in order, computed as [`each`] computes them.
pub fn map<R: Send>(count: usize, task: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let slots: Vec<Mutex<Option<R>>> = (0..count).map(|_| Mutex::new(None)).collect();
    each(count, |i| {
        let r = task(i);
        *lock(&slots[i]) = Some(r);
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(PoisonError::into_inner)
                .expect("every task ran")
        })
        .collect()
}

/// Split `out` into pieces of `per` items and run `task(i, piece_i)` on each as [`each`] runs tasks.
pub fn chunks_mut<T: Send>(out: &mut [T], per: usize, task: impl Fn(usize, &mut [T]) + Sync) {
    // Each piece behind its own lock, taken once, by the thread that took its index.
    let pieces: Vec<Mutex<&mut [T]>> = out.chunks_mut(per.max(1)).map(Mutex::new).collect();
    each(pieces.len(), |i| {
        task(i, &mut lock(&pieces[i]));
    });
}

/// Return `(left(), right())`, the two computed as [`each`] runs two tasks.
pub fn join<A: Send, B: Send>(left: impl FnOnce() -> A + Send, right: impl FnOnce() -> B + Send) -> (A, B) {
    let (left, right) = (Mutex::new(Some(left)), Mutex::new(Some(right)));
    let (a, b) = (Mutex::new(None), Mutex::new(None));
    each(2, |i| {
        if i == 0 {
            *lock(&a) = lock(&left).take().map(|f| f());
        } else {
            *lock(&b) = lock(&right).take().map(|f| f());
        }
    });
    let a = a.into_inner().unwrap_or_else(PoisonError::into_inner);
    let b = b.into_inner().unwrap_or_else(PoisonError::into_inner);
    (a.expect("the left task ran"), b.expect("the right task ran"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_runs_every_task_once_and_map_and_chunks_keep_the_order() {
        for count in [0, 1, 2, 3, 100, 1000] {
            let runs: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
            each(count, |i| {
                runs[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1), "{count} tasks");
            assert_eq!(map(count, |i| i * 3), (0..count).map(|i| i * 3).collect::<Vec<_>>());
            let mut out = vec![0usize; count];
            chunks_mut(&mut out, 7, |i, piece| {
                for (k, slot) in piece.iter_mut().enumerate() {
                    *slot = 7 * i + k;
                }
            });
            assert_eq!(out, (0..count).collect::<Vec<_>>());
        }
        assert_eq!(join(|| 1, || "two"), (1, "two"));
    }

    #[test]
    fn a_panic_in_any_task_reaches_the_caller() {
        for bad in [0, 1, 63] {
            let caught = std::panic::catch_unwind(|| each(64, |i| assert_ne!(i, bad, "task {i}")));
            assert!(caught.is_err());
        }
        assert!(std::panic::catch_unwind(|| join(|| (), || panic!("right"))).is_err());
        assert!(std::panic::catch_unwind(|| join(|| panic!("left"), || ())).is_err());
    }

    #[test]
    fn callers_side_by_side_and_nested_each_get_their_own_answers() {
        std::thread::scope(|s| {
            for t in 0..4usize {
                s.spawn(move || {
                    for round in 0..50usize {
                        let got = map(40, |i| map(3, |j| i * j + t + round).iter().sum::<usize>());
                        let want: Vec<usize> = (0..40).map(|i| 3 * i + 3 * (t + round)).collect();
                        assert_eq!(got, want);
                    }
                });
            }
        });
    }
}
