//! The worker threads: one rayon pool per process.
//!
//! Not rayon's global pool: `Store.verify` forks worker processes, and a forked child
//! inherits the parent's pool without its threads, so work sent to it would never run.
//! Here a child (another process id) builds a pool of its own.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

/// A pool and the process that built it.
struct Owned {
    pid: u32,
    pool: ThreadPool,
}

/// This process's pool, or a forked parent's (null before the first). Read and replaced
/// without a lock: a child forked while another thread of the parent held one would find
/// it held forever. Never freed: a parent's pool has no threads in a child to stop.
static POOL: AtomicPtr<Owned> = AtomicPtr::new(std::ptr::null_mut());

fn current() -> &'static ThreadPool {
    let pid = std::process::id();
    let seen = POOL.load(Ordering::Acquire);
    // SAFETY: a pointer in POOL comes from `Box::into_raw` below and is never freed.
    if let Some(owned) = unsafe { seen.as_ref() } {
        if owned.pid == pid {
            return &owned.pool;
        }
    }
    let pool = ThreadPoolBuilder::new()
        .thread_name(|i| format!("compactstore-hash-{i}"))
        .build()
        .expect("start the hashing threads");
    let built = Box::into_raw(Box::new(Owned { pid, pool }));
    match POOL.compare_exchange(seen, built, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `built` is now in POOL, never freed.
        Ok(_) => unsafe { &(*built).pool },
        Err(_) => {
            // Another thread of this process put its pool there first: use that one.
            // SAFETY: `built` was never shared; its pool's threads are this process's.
            drop(unsafe { Box::from_raw(built) });
            current()
        }
    }
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
/// worker takes tens of microseconds to wake on an idle machine, and on a busy one it may
/// wait milliseconds for a core, much more than a job of one or two milliseconds. A worker
/// joins only while tasks are left; once the caller has taken the last one it waits for
/// the workers that joined, never for one that has not started. On a pool thread (work
/// nested in a task) the tasks run where they are.
pub fn share(count: usize, task: impl Fn(usize) + Sync) {
    let workers = if count < 2 || rayon::current_thread_index().is_some() {
        0
    } else {
        (available() - 1).min(count - 1)
    };
    if workers == 0 {
        (0..count).for_each(task);
        return;
    }
    let task: &(dyn Fn(usize) + Sync) = &task;
    // SAFETY (of the lifetime dropped here): the pointer travels in jobs that may outlive
    // this call, but a job follows it only after `Shared::enter` succeeds, and `Close`
    // (dropped when this call returns or unwinds) makes `enter` fail from then on and
    // waits for every job that entered to leave: no call through it outlives `task`.
    let task: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(task) };
    let shared = Arc::new(Shared {
        task,
        count,
        next: AtomicUsize::new(0),
        state: Mutex::new(State {
            open: true,
            inside: 0,
            panic: None,
        }),
        left: Condvar::new(),
    });
    let pool = current();
    // Before the first job exists: whatever unwinds from here on closes the work first.
    let close = Close(&shared);
    for _ in 0..workers {
        let shared = Arc::clone(&shared);
        pool.spawn(move || {
            if shared.enter() {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shared.run()));
                shared.leave(ran.err());
            }
        });
    }
    shared.run();
    drop(close);
    let panic = lock(&shared.state).panic.take();
    if let Some(payload) = panic {
        std::panic::resume_unwind(payload);
    }
}

/// What [`share`]'s caller and the workers it asked for hold in common.
struct Shared {
    /// The caller's task: valid while the work is open or a worker is inside.
    task: *const (dyn Fn(usize) + Sync),
    count: usize,
    next: AtomicUsize,
    state: Mutex<State>,
    left: Condvar,
}

struct State {
    /// Whether workers may still join (tasks may be left).
    open: bool,
    /// Workers that joined and have not left.
    inside: usize,
    /// The first panic of a worker's task, for the caller to raise.
    panic: Option<Box<dyn std::any::Any + Send>>,
}

impl Shared {
    /// Run tasks until none is left.
    fn run(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.count {
                break;
            }
            // SAFETY: run by the caller during `share`, or by a worker between `enter`
            // and `leave`: `task` is alive (see `share`).
            unsafe { (*self.task)(i) };
        }
    }

    /// Join as a worker; false when the caller has closed the work (then touch nothing).
    fn enter(&self) -> bool {
        let mut state = lock(&self.state);
        if state.open {
            state.inside += 1;
        }
        state.open
    }

    fn leave(&self, panic: Option<Box<dyn std::any::Any + Send>>) {
        let mut state = lock(&self.state);
        state.inside -= 1;
        if state.panic.is_none() {
            state.panic = panic;
        }
        self.left.notify_all();
    }
}

// SAFETY: `task` is `Sync` and followed only while alive (see `share`); the rest is
// atomics and a mutex.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// Closes a [`share`] when dropped (after the caller's tasks, or while its panic unwinds):
/// no worker joins after it, and it waits for those that joined.
struct Close<'a>(&'a Shared);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.0.state);
        state.open = false;
        while state.inside > 0 {
            state = self.0.left.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Return how many threads may hash at once: the pool's, which is one per core.
fn available() -> usize {
    current().current_num_threads().max(1)
}

/// Split `out` into pieces of `per` and run `task(i, piece_i)` on each as [`share`] does.
pub fn share_chunks_mut<T: Send>(out: &mut [T], per: usize, task: impl Fn(usize, &mut [T]) + Sync) {
    // Each piece behind its own lock, taken once by whichever thread claims its index.
    let pieces: Vec<Mutex<&mut [T]>> = out.chunks_mut(per.max(1)).map(Mutex::new).collect();
    share(pieces.len(), |i| {
        task(i, &mut lock(&pieces[i]));
    });
}

/// Return `task(i)` for every `i` in `0..count`, in order, computed as [`share`] does.
pub fn share_map<R: Send>(count: usize, task: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let slots: Vec<Mutex<Option<R>>> = (0..count).map(|_| Mutex::new(None)).collect();
    share(count, |i| {
        let r = task(i);
        *lock(&slots[i]) = Some(r);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_runs_every_task_once_and_maps_in_order() {
        for count in [0, 1, 2, 3, 100, 1000] {
            let runs: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
            share(count, |i| {
                runs[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1), "{count} tasks");
            assert_eq!(
                share_map(count, |i| i * 3),
                (0..count).map(|i| i * 3).collect::<Vec<_>>()
            );
            let mut out = vec![0usize; count];
            share_chunks_mut(&mut out, 7, |i, piece| {
                for (k, slot) in piece.iter_mut().enumerate() {
                    *slot = 7 * i + k;
                }
            });
            assert_eq!(out, (0..count).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_panic_in_any_task_reaches_the_caller_after_the_others_stop() {
        for bad in [0, 1, 63] {
            let done = AtomicUsize::new(0);
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                share(64, |i| {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    assert_ne!(i, bad, "task {i}");
                    done.fetch_add(1, Ordering::Relaxed);
                });
            }));
            assert!(caught.is_err());
            // Nothing runs once share has returned.
            let after = done.load(Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(5));
            assert_eq!(done.load(Ordering::Relaxed), after);
        }
    }

    #[test]
    fn no_task_runs_after_its_call_returns_with_callers_side_by_side_nested_and_panicking() {
        use std::sync::atomic::AtomicBool;
        // Each call's flag outlives the test (leaked), so a late task reads it safely.
        static LATE: AtomicUsize = AtomicUsize::new(0);
        let call = |round: usize, panic_at: Option<usize>| {
            let returned: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                share(40, |i| {
                    if returned.load(Ordering::SeqCst) {
                        LATE.fetch_add(1, Ordering::SeqCst);
                    }
                    if i % 13 == round % 13 {
                        // Nested: inline on a pool thread, shared again on the caller's.
                        share(3, |_| std::hint::black_box(()));
                    }
                    assert_ne!(Some(i), panic_at);
                });
            }));
            returned.store(true, Ordering::SeqCst);
            assert_eq!(caught.is_err(), panic_at.is_some());
        };
        std::thread::scope(|s| {
            for t in 0..3 {
                s.spawn(move || {
                    for round in 0..300 {
                        call(round, [None, Some(round % 40), None][(round + t) % 3]);
                    }
                });
            }
        });
        // Give queued workers of the last calls time to find their work closed.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(LATE.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_caller_finishes_alone_while_every_pool_thread_is_busy() {
        let pool = current();
        for _ in 0..available() {
            pool.spawn(|| std::thread::sleep(std::time::Duration::from_millis(1000)));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let start = std::time::Instant::now();
        let sum = AtomicUsize::new(0);
        share(100, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
        assert!(
            start.elapsed() < std::time::Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
    }
    #[test]
    #[cfg(target_os = "linux")]
    fn a_child_forked_while_other_threads_take_the_pool_hashes_in_a_pool_of_its_own() {
        use std::sync::atomic::AtomicBool;
        extern "C" {
            fn fork() -> i32;
            fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
            fn alarm(seconds: u32) -> u32;
            fn _exit(code: i32) -> !;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::black_box(current());
                    }
                })
            })
            .collect();
        let mut failed = 0;
        for _ in 0..200 {
            // SAFETY: the child only builds its pool, runs work on it and exits; a child
            // that hangs is ended by its alarm.
            let pid = unsafe { fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                unsafe { alarm(5) };
                let runs = AtomicUsize::new(0);
                share(64, |_| {
                    runs.fetch_add(1, Ordering::Relaxed);
                });
                let ok = runs.load(Ordering::Relaxed) == 64 && install(rayon::current_thread_index).is_some();
                unsafe { _exit(if ok { 0 } else { 1 }) };
            }
            let mut status = 0;
            // SAFETY: waits for the child just forked.
            assert_eq!(unsafe { waitpid(pid, &mut status, 0) }, pid);
            failed += usize::from(status != 0);
        }
        stop.store(true, Ordering::Relaxed);
        for t in takers {
            t.join().unwrap();
        }
        assert_eq!(failed, 0, "children that hung or failed");
    }
}
