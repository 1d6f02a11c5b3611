//! The content digest of a span (`compactstore.content`): one BLAKE3 over a tag, the
//! bodies back to back, each body's length and their number (8-byte big-endian).
//!
//! A restoration reads a span's bodies in batches and hashes each batch as it comes, so
//! the bodies are hashed while they are still in cache, on the calling thread.

use blake3::Hasher;

use crate::hash::Hash;

/// Bodies shorter than this are copied into one buffer before hashing: BLAKE3 hashes the
/// whole chunks of one long input several at a time (SIMD lanes), a short body at a time it
/// could not; a longer body has enough whole chunks of its own to be hashed where it lies.
const DIRECT: usize = 16 * 1024;

/// The buffer is hashed when it would grow past this (it stays below malloc's mmap
/// threshold, so it costs no page faults), and at the end of each batch.
const STAGE: usize = 64 * 1024;

/// A content digest being computed: the bodies so far hashed or staged, and their lengths.
pub struct State {
    hasher: Hasher,
    stage: Vec<u8>,
    lengths: Vec<u64>,
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
        }
    }

    /// Add the next body.
    pub fn add(&mut self, body: &[u8]) {
        self.lengths.push(body.len() as u64);
        if body.len() >= DIRECT {
            self.flush();
            self.hasher.update(body);
            return;
        }
        if self.stage.len() + body.len() > STAGE {
            self.flush();
        }
        self.stage.extend_from_slice(body);
    }

    /// Hash what is buffered: at the end of each batch, while its bodies are in cache.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The content digest of `bodies` under `tag`, fed as one batch.
    fn digest(tag: &[u8], bodies: &[&[u8]]) -> Hash {
        let mut state = State::new(tag);
        for body in bodies {
            state.add(body);
        }
        state.finish()
    }

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
            .map(|(k, &n)| {
                (0..n)
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(k as u8))
                    .collect()
            })
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
            vec![STAGE - 1, 1, STAGE, STAGE + 1, 3, DIRECT - 1, DIRECT, 7],
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
}
