//! BLAKE3 leaf and node hashes, through the blake3 crate's stable API.
//!
//! A leaf is `BLAKE3(0x00 || entry)` and a node `BLAKE3(0x01 || left || right)`: the
//! prefixes keep a leaf from being passed off as a node. Each message is hashed by the
//! crate as one input: `blake3::hash` over the prefixed bytes, or, for a long entry, the
//! subtrees of that input through `blake3::hazmat` (see [`leaf`]). The tests below hold
//! every path to `blake3::hash` of the prefixed message.

use blake3::hazmat::{left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode};
use blake3::{Hasher, CHUNK_LEN};

use crate::par;

/// A 32-byte BLAKE3 digest: a leaf, a node or a root.
pub type Hash = [u8; 32];

/// Prefixed to an entry before hashing it as a leaf.
pub const LEAF_PREFIX: u8 = 0x00;
/// Prefixed to two child hashes before hashing them as a node.
pub const NODE_PREFIX: u8 = 0x01;

/// The longest prefixed leaf copied whole before hashing: sixteen chunks, the most the
/// crate hashes side by side (AVX-512). The prefix shifts every chunk boundary of the
/// entry by a byte, so only a copy lets the crate take the entry's chunks together.
const COPIED: usize = 16 * CHUNK_LEN;

/// From this many bytes, a single leaf's subtrees are hashed on two threads at a time: a
/// thread started for less would cost more than the half it takes off the caller.
const SPLIT: usize = 512 * 1024;

const BLOCK_LEN: usize = 64;

/// Return about how many block compressions on one SIMD lane hashing a leaf of `len` bytes
/// takes (a node takes two): a message shorter than two chunks is compressed block after
/// block, a longer one mostly several chunks side by side.
pub fn leaf_cost(len: usize) -> usize {
    let blocks = len / BLOCK_LEN + 1;
    if len < 2 * CHUNK_LEN {
        blocks
    } else {
        CHUNK_LEN / BLOCK_LEN + blocks / 4
    }
}

/// Return `BLAKE3("")`, the root of the empty tree.
pub fn empty() -> Hash {
    *blake3::hash(b"").as_bytes()
}

/// Return the leaf hash `BLAKE3(0x00 || entry)`, on every core for a long entry.
pub fn leaf(entry: &[u8]) -> Hash {
    leaf_in(entry, par::threads(), &mut Vec::new())
}

/// Return the leaf hash of `entry` on at most `threads` threads, using `scratch` for copies.
///
/// Up to [`COPIED`] bytes the prefixed message is copied and hashed in one call. Past
/// that, the message is hashed as BLAKE3's tree of it (`blake3::hazmat`): split at
/// `left_subtree_len` down to its leftmost subtree of at most [`COPIED`] bytes, which
/// holds the prefix and is copied; each right subtree lies in the entry as it is, whole
/// chunks at a chunk-aligned input offset, and is hashed there with no copy.
fn leaf_in(entry: &[u8], threads: usize, scratch: &mut Vec<u8>) -> Hash {
    let len = entry.len() + 1;
    if len <= COPIED {
        return *blake3::hash(prefixed(entry, len, scratch)).as_bytes();
    }
    let left = left_subtree_len(len as u64) as usize;
    let (l, r) = subtrees(entry, 0, left, len - left, threads, scratch);
    *merge_subtrees_root(&l, &r, Mode::Hash).as_bytes()
}

/// The chaining values of the two subtrees of the prefixed message at `[start, start + left)`
/// and `[start + left, start + left + right)`, on two threads when they are long and `threads` allows.
fn subtrees(
    entry: &[u8],
    start: usize,
    left: usize,
    right: usize,
    threads: usize,
    scratch: &mut Vec<u8>,
) -> (ChainingValue, ChainingValue) {
    if threads < 2 || left + right < SPLIT {
        let l = subtree(entry, start, left, 1, scratch);
        let r = subtree(entry, start + left, right, 1, scratch);
        return (l, r);
    }
    let half = threads / 2;
    par::join(
        || subtree(entry, start, left, threads - half, scratch),
        || subtree(entry, start + left, right, half, &mut Vec::new()),
    )
}

/// The chaining value of the subtree of the prefixed message `0x00 || entry` at
/// `[start, start + len)`. Requires a subtree of BLAKE3's tree of that message (as
/// `left_subtree_len` splits it) longer than one chunk, or a chunk that is not the whole message.
fn subtree(entry: &[u8], start: usize, len: usize, threads: usize, scratch: &mut Vec<u8>) -> ChainingValue {
    if start > 0 && (threads < 2 || len < SPLIT) {
        // Message byte `start` is entry byte `start - 1`.
        return Hasher::new()
            .set_input_offset(start as u64)
            .update(&entry[start - 1..start - 1 + len])
            .finalize_non_root();
    }
    if start == 0 && len <= COPIED {
        return Hasher::new().update(prefixed(entry, len, scratch)).finalize_non_root();
    }
    let left = left_subtree_len(len as u64) as usize;
    let (l, r) = subtrees(entry, start, left, len - left, threads, scratch);
    merge_subtrees_non_root(&l, &r, Mode::Hash)
}

/// The first `len` bytes of the message `0x00 || entry`, copied into `scratch`.
fn prefixed<'a>(entry: &[u8], len: usize, scratch: &'a mut Vec<u8>) -> &'a [u8] {
    scratch.clear();
    scratch.push(LEAF_PREFIX);
    scratch.extend_from_slice(&entry[..len - 1]);
    scratch
}

/// Write the leaf hash of each entry to `out` (as long as `entries`), on the calling thread.
pub fn leaves_into(entries: &[&[u8]], out: &mut [Hash]) {
    assert_eq!(entries.len(), out.len());
    let mut scratch = Vec::new();
    for (entry, slot) in entries.iter().zip(out) {
        *slot = leaf_in(entry, 1, &mut scratch);
    }
}

/// Return the node hash `BLAKE3(0x01 || left || right)`.
pub fn node(left: &Hash, right: &Hash) -> Hash {
    let mut message = [0u8; 65];
    message[0] = NODE_PREFIX;
    message[1..33].copy_from_slice(left);
    message[33..].copy_from_slice(right);
    *blake3::hash(&message).as_bytes()
}

/// Return `BLAKE3(0x01 || left || right)` of byte strings of any length (a node's
/// children are 32-byte hashes; this serves callers that pass something else).
pub fn node_of_any(left: &[u8], right: &[u8]) -> Hash {
    *Hasher::new()
        .update(&[NODE_PREFIX])
        .update(left)
        .update(right)
        .finalize()
        .as_bytes()
}

/// Write the node hash of each pair of neighbours in `level` to `out`, on the calling
/// thread; `out` has `level.len() / 2` places (an odd last hash is left out).
pub fn pairs_into(level: &[Hash], out: &mut [Hash]) {
    assert_eq!(out.len(), level.len() / 2);
    for (pair, slot) in level.chunks_exact(2).zip(out) {
        *slot = node(&pair[0], &pair[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(prefix: u8, data: &[u8]) -> Hash {
        let mut v = vec![prefix];
        v.extend_from_slice(data);
        *blake3::hash(&v).as_bytes()
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn leaf_equals_blake3_of_the_prefixed_entry_at_every_length_up_to_18_chunks() {
        let mut scratch = Vec::new();
        for n in 0..18 * CHUNK_LEN + 2 {
            let e = bytes(n, 7);
            assert_eq!(leaf_in(&e, 1, &mut scratch), reference(LEAF_PREFIX, &e), "length {n}");
        }
    }

    #[test]
    fn leaf_equals_blake3_around_every_power_of_two_chunks_on_one_and_many_threads() {
        let mut scratch = Vec::new();
        for chunks in (4..12).map(|k| 1usize << k) {
            for n in [
                chunks * CHUNK_LEN - 2,
                chunks * CHUNK_LEN - 1,
                chunks * CHUNK_LEN,
                chunks * CHUNK_LEN + 1,
            ] {
                let e = bytes(n, 3);
                let want = reference(LEAF_PREFIX, &e);
                for threads in [1, 2, 3, 4, 8] {
                    assert_eq!(
                        leaf_in(&e, threads, &mut scratch),
                        want,
                        "length {n}, {threads} threads"
                    );
                }
            }
        }
        for n in [SPLIT - 1, SPLIT, 5 * SPLIT + 3, 3 * CHUNK_LEN * 1000 + 17] {
            let e = bytes(n, 5);
            assert_eq!(leaf(&e), reference(LEAF_PREFIX, &e), "length {n}");
        }
    }

    #[test]
    fn leaves_in_a_batch_equal_one_leaf_per_entry() {
        let lens: Vec<usize> = (0..150)
            .map(|i| {
                [
                    1024, 1025, 2047, 1500, 0, 3000, 1088, 1087, 63, 64, 127, 1023, 200, 17_000,
                ][i % 14]
                    + i % 3
            })
            .collect();
        let entries: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| bytes(n, i as u8)).collect();
        let refs: Vec<&[u8]> = entries.iter().map(|e| e.as_slice()).collect();
        let mut out = vec![[0u8; 32]; refs.len()];
        leaves_into(&refs, &mut out);
        for (e, got) in refs.iter().zip(&out) {
            assert_eq!(*got, reference(LEAF_PREFIX, e), "length {}", e.len());
        }
    }

    #[test]
    fn nodes_one_at_a_time_and_by_level_equal_blake3_of_the_prefixed_pair() {
        let level: Vec<Hash> = (0..39).map(|i| reference(LEAF_PREFIX, &[i as u8])).collect();
        let mut out = vec![[0u8; 32]; level.len() / 2];
        pairs_into(&level, &mut out);
        for (j, got) in out.iter().enumerate() {
            let (l, r) = (&level[2 * j], &level[2 * j + 1]);
            let want = reference(NODE_PREFIX, &[l.as_slice(), r.as_slice()].concat());
            assert_eq!(*got, want);
            assert_eq!(node(l, r), want);
            assert_eq!(node_of_any(l, r), want);
        }
    }

    #[test]
    fn the_empty_root_is_blake3_of_nothing() {
        assert_eq!(empty(), *blake3::hash(b"").as_bytes());
    }
}
