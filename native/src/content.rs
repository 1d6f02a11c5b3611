//! The content digest of a span (`compactstore.content`): one BLAKE3 over a tag, the
//! bodies back to back, each body's length and their number (8-byte big-endian).
//!
//! A restoration reads a span's bodies in batches. Past [`THREAD_BYTES`] the batches are
//! handed to a thread of the digest's own as they are read, so hashing one batch overlaps
//! reading the next (the reader holds the GIL to build each body, the hashing thread never
//! needs it) and only the last batch is hashed after the read ends.

use std::sync::mpsc;
use std::thread;

use blake3::Hasher;

use crate::hash::Hash;

/// Bodies shorter than this are copied into one buffer before hashing: BLAKE3 hashes the
/// whole chunks of one long input several at a time (SIMD lanes), a short body at a time it
/// could not. The buffer is hashed when it would grow past this (it stays below malloc's
/// mmap threshold, so it costs no page faults), and at the end of each batch.
const STAGE: usize = 64 * 1024;

/// From this many bytes on, the rest of a digest is hashed on its own thread; below, the
/// thread would cost more than the hashing it takes off the reader (tens of microseconds).
pub const THREAD_BYTES: usize = 256 * 1024;

/// A content digest being computed: the bodies so far hashed or staged, and their lengths.
pub struct State {
    hasher: Hasher,
    stage: Vec<u8>,
    lengths: Vec<u64>,
    bytes: usize,
}

impl State {
    /// Start a digest whose input begins with `tag`.
    pub fn new(tag: &[u8]) -> Self {
        let mut stage = Vec::with_capacity(STAGE);
        stage.extend_from_slice(tag);
        State {
            hasher: Hasher::new(),
            stage,
            lengths: Vec::new(),
            bytes: 0,
        }
    }

    /// Add the next body.
    pub fn add(&mut self, body: &[u8]) {
        self.lengths.push(body.len() as u64);
        self.bytes += body.len();
        if body.len() >= STAGE {
            self.flush();
            self.hasher.update(body);
            return;
        }
        if self.stage.len() + body.len() > STAGE {
            self.flush();
        }
        self.stage.extend_from_slice(body);
    }

    /// Return the bytes of bodies added so far.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Hash what is buffered: at the end of a batch, so that hashing keeps up with the reader.
    pub fn flush(&mut self) {
        if !self.stage.is_empty() {
            self.hasher.update(&self.stage);
            self.stage.clear();
        }
    }

    /// Return the digest: the lengths and their number go in after the bodies.
    pub fn finish(mut self) -> Hash {
        let lengths = std::mem::take(&mut self.lengths);
        let count = lengths.len() as u64;
        for n in lengths.into_iter().chain(std::iter::once(count)) {
            if self.stage.len() + 8 > STAGE {
                self.flush();
            }
            self.stage.extend_from_slice(&n.to_be_bytes());
        }
        self.flush();
        *self.hasher.finalize().as_bytes()
    }
}

/// Return the content digest of `bodies` under `tag`, on the calling thread.
pub fn digest(tag: &[u8], bodies: &[&[u8]]) -> Hash {
    let mut state = State::new(tag);
    for body in bodies {
        state.add(body);
    }
    state.finish()
}

/// A body the hashing thread reads: it owns a reference that keeps the bytes alive.
pub trait Body: AsRef<[u8]> + Send + 'static {}
impl<T: AsRef<[u8]> + Send + 'static> Body for T {}

/// A digest whose batches are hashed on its own thread; the batches come back at the end,
/// so that their owners are dropped by the caller (for Python objects: with the GIL held).
pub struct Threaded<B: Body> {
    tx: Option<mpsc::Sender<Vec<B>>>,
    worker: Option<thread::JoinHandle<(Hash, Vec<Vec<B>>)>>,
    /// The process that started the thread: a forked child has the digest but not the thread.
    pid: u32,
}

impl<B: Body> Threaded<B> {
    /// Start the thread, continuing `state`.
    pub fn start(mut state: State) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Vec<B>>();
        let worker = thread::Builder::new()
            .name("compactstore-digest".into())
            .spawn(move || {
                let mut kept = Vec::new();
                for batch in rx {
                    for body in &batch {
                        state.add(body.as_ref());
                    }
                    state.flush();
                    kept.push(batch);
                }
                (state.finish(), kept)
            })?;
        Ok(Threaded {
            tx: Some(tx),
            worker: Some(worker),
            pid: std::process::id(),
        })
    }

    /// Hand the next batch to the thread; false when it is gone (it panicked, or this is a
    /// forked child of the process that started it).
    pub fn send(&self, batch: Vec<B>) -> bool {
        self.pid == std::process::id() && self.tx.as_ref().is_some_and(|tx| tx.send(batch).is_ok())
    }

    /// Wait for the thread; return the digest and the batches, or None when it panicked (or
    /// this is a forked child of the process that started it).
    pub fn finish(mut self) -> Option<(Hash, Vec<Vec<B>>)> {
        self.join()
    }

    fn join(&mut self) -> Option<(Hash, Vec<Vec<B>>)> {
        drop(self.tx.take()); // ends the thread's loop
        let worker = self.worker.take()?;
        if self.pid != std::process::id() {
            // Forked while the thread ran: it is not in this process, and joining it would wait forever.
            std::mem::forget(worker);
            return None;
        }
        worker.join().ok()
    }
}

impl<B: Body> Drop for Threaded<B> {
    fn drop(&mut self) {
        // Abandoned: the thread ends with the channel; nothing outlives the digest.
        self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(tag: &[u8], bodies: &[Vec<u8>]) -> Hash {
        let mut input = tag.to_vec();
        for b in bodies {
            input.extend_from_slice(b);
        }
        for b in bodies {
            input.extend_from_slice(&(b.len() as u64).to_be_bytes());
        }
        input.extend_from_slice(&(bodies.len() as u64).to_be_bytes());
        *blake3::hash(&input).as_bytes()
    }

    fn bodies(sizes: &[usize]) -> Vec<Vec<u8>> {
        sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(k as u8)).collect())
            .collect()
    }

    const TAG: &[u8] = b"compactstore/span-content/v1\x00";

    #[test]
    fn digest_equals_blake3_of_the_whole_input_for_bodies_of_every_size_class() {
        let cases: Vec<Vec<usize>> = vec![
            vec![],
            vec![0],
            vec![0, 0, 1],
            vec![1400; 1000],
            vec![STAGE - 1, 1, STAGE, STAGE + 1, 3],
            vec![STAGE / 2 + 1; 5],
            vec![32 * 1024; 40],
            vec![200_000, 5, 1 << 20],
            (0..300).map(|i| (i * 97) % 5000).collect(),
        ];
        for sizes in cases {
            let b = bodies(&sizes);
            let slices: Vec<&[u8]> = b.iter().map(|v| v.as_slice()).collect();
            assert_eq!(digest(TAG, &slices), reference(TAG, &b), "sizes {sizes:?}");
        }
    }

    #[test]
    fn the_threaded_digest_equals_the_inline_one_whatever_the_batches() {
        let b = bodies(&(0..500).map(|i| (i * 131) % 40_000).collect::<Vec<_>>());
        let want = reference(TAG, &b);
        for batch in [1, 7, 64, 500] {
            let mut state = State::new(TAG);
            state.add(&b[0]);
            let t = Threaded::start(state).unwrap();
            for chunk in b[1..].chunks(batch) {
                assert!(t.send(chunk.to_vec()));
            }
            let (got, kept) = t.finish().unwrap();
            assert_eq!(got, want, "batches of {batch}");
            assert_eq!(kept.iter().map(Vec::len).sum::<usize>(), b.len() - 1);
        }
    }

    #[test]
    fn an_abandoned_threaded_digest_ends_its_thread() {
        let t = Threaded::<Vec<u8>>::start(State::new(TAG)).unwrap();
        assert!(t.send(vec![vec![1, 2, 3]]));
        drop(t); // joins: the test would hang otherwise
    }
}
