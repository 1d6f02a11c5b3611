//! BLAKE3 leaf and node hashes, many at a time.
//!
//! A leaf is `BLAKE3(0x00 || entry)` and a node `BLAKE3(0x01 || left || right)`: the
//! prefixes keep a leaf from being passed off as a node. Hashed one at a time, a message of
//! a chunk or two runs on one SIMD lane, its blocks one after another: on AVX-512 about a
//! sixth as fast as one long buffer. Here the whole blocks of up to [`LANES`] messages go
//! through the crate's multi-lane compression together (`Platform::hash_many`), and the
//! partial last blocks, which it cannot take, through `lanes.rs`.
//!
//! `blake3::platform` is exported without a stability promise, which is why Cargo.toml
//! pins the crate's exact version; the tests below hold every path to `blake3::hash`.

use blake3::platform::{le_bytes_from_words_32, words_from_le_bytes_32, Platform};
use blake3::{Hasher, IncrementCounter};

use crate::lanes::Blocks;
use crate::{pool, wide};

/// A 32-byte BLAKE3 digest: a leaf, a node or a root.
pub type Hash = [u8; 32];

/// Prefixed to an entry before hashing it as a leaf.
pub const LEAF_PREFIX: u8 = 0x00;
/// Prefixed to two child hashes before hashing them as a node.
pub const NODE_PREFIX: u8 = 0x01;

const BLOCK_LEN: usize = 64;
const CHUNK_LEN: usize = 1024;

// The compression function's domain flags and IV, from the BLAKE3 specification
// (section 2.1, table 3; and the IV of SHA-256). The crate keeps its own private.
const CHUNK_START: u8 = 1 << 0;
const CHUNK_END: u8 = 1 << 1;
const PARENT: u8 = 1 << 2;
const ROOT: u8 = 1 << 3;
pub(crate) const IV: [u32; 8] = [
    0x6A09_E667,
    0xBB67_AE85,
    0x3C6E_F372,
    0xA54F_F53A,
    0x510E_527F,
    0x9B05_688C,
    0x1F83_D9AB,
    0x5BE0_CD19,
];

/// Messages hashed side by side: the widest SIMD degree of the crate (AVX-512).
pub const LANES: usize = 16;

/// From this many messages of a block count on, they go through `wide.rs` together: fewer
/// would leave most of its sixteen lanes idle, where the narrower lanes of `hash_many` fit.
const WIDE_MIN: usize = 8;

/// From this size on an entry is hashed by every core (`update_rayon`); the blake3
/// documentation puts the break-even near 128 KiB.
const RAYON_ENTRY: usize = 128 * 1024;

// Detected on every call, not cached behind a `OnceLock`: a child forked while another
// thread was filling one would wait on it forever. The CPU features are cached by std in
// atomics, so a detection is a few loads.
fn platform() -> Platform {
    Platform::detect()
}

/// Return `BLAKE3("")`, the root of the empty tree.
pub fn empty() -> Hash {
    *blake3::hash(b"").as_bytes()
}

/// Return the leaf hash `BLAKE3(0x00 || entry)`.
pub fn leaf(entry: &[u8]) -> Hash {
    if entry.len() < CHUNK_LEN {
        // One chunk: its blocks are compressed one after another whatever is done.
        *Hasher::new().update(&[LEAF_PREFIX]).update(entry).finalize().as_bytes()
    } else {
        long_leaf(entry, &mut Vec::new())
    }
}

/// Return the leaf hash of an entry of a chunk or more, using `scratch` for its prefixed copy.
fn long_leaf(entry: &[u8], scratch: &mut Vec<u8>) -> Hash {
    let mut h = Hasher::new();
    if entry.len() < RAYON_ENTRY {
        // The prefix shifts every chunk by a byte: hashed as it lies, the entry's first
        // chunk would be compressed alone; copied, all whole chunks go through SIMD together.
        scratch.clear();
        scratch.push(LEAF_PREFIX);
        scratch.extend_from_slice(entry);
        h.update(scratch);
    } else {
        h.update(&[LEAF_PREFIX]);
        pool::install(|| h.update_rayon(entry));
    }
    *h.finalize().as_bytes()
}

/// Write the leaf hash of each entry to `out` (as long as `entries`), on the calling thread.
pub fn leaves_into(entries: &[&[u8]], out: &mut [Hash]) {
    assert_eq!(entries.len(), out.len());
    if !wide::available() {
        return narrow_leaves_into(entries, out);
    }
    // Entries whose prefixed messages have as many blocks are hashed sixteen at a time,
    // whole, one per lane; the few left over in each count go the narrower way.
    let blocks = |i: &usize| wide::blocks(entries[*i].len() + 1);
    let mut order: Vec<usize> = (0..entries.len()).filter(|&i| entries[i].len() < RAYON_ENTRY).collect();
    order.sort_by_key(blocks);
    let mut rest: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].len() >= RAYON_ENTRY)
        .collect();
    let mut hashes = [[0u8; 32]; LANES];
    for same in order.chunk_by(|a, b| blocks(a) == blocks(b)) {
        for group in same.chunks(LANES) {
            if group.len() < WIDE_MIN {
                rest.extend_from_slice(group);
                continue;
            }
            let data: [&[u8]; LANES] = std::array::from_fn(|j| entries[group[j.min(group.len() - 1)]]);
            let hashes = &mut hashes[..group.len()];
            wide::prefixed(LEAF_PREFIX, &data[..group.len()], hashes);
            for (&i, h) in group.iter().zip(hashes.iter()) {
                out[i] = *h;
            }
        }
    }
    if !rest.is_empty() {
        let some: Vec<&[u8]> = rest.iter().map(|&i| entries[i]).collect();
        let mut hashes = vec![[0u8; 32]; rest.len()];
        narrow_leaves_into(&some, &mut hashes);
        for (&i, h) in rest.iter().zip(hashes) {
            out[i] = h;
        }
    }
}

/// [`leaves_into`] without the whole-message lanes of `wide.rs`.
fn narrow_leaves_into(entries: &[&[u8]], out: &mut [Hash]) {
    let p = platform();
    // A prefixed entry of one chunk, or of one whole chunk and part of another, is hashed
    // side by side with the others of its kind; a longer one fills SIMD lanes with its own
    // whole chunks.
    let (mut one, mut two, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    for (i, entry) in entries.iter().enumerate() {
        match entry.len() {
            n if n < CHUNK_LEN => one.push(i),
            n if n < 2 * CHUNK_LEN - 1 => two.push(i),
            _ => out[i] = long_leaf(entry, &mut scratch),
        }
    }
    if !one.is_empty() {
        let chunks: Vec<Chunk> = one
            .iter()
            .map(|&i| Chunk {
                prefix: true,
                data: entries[i],
            })
            .collect();
        let mut hashes = vec![[0u8; 32]; one.len()];
        chunks_many(p, &chunks, 0, true, &mut hashes);
        for (&i, h) in one.iter().zip(hashes) {
            out[i] = h;
        }
    }
    if !two.is_empty() {
        // The root of a two-chunk message is the parent of its two chunks' chaining values.
        let firsts: Vec<Chunk> = two
            .iter()
            .map(|&i| Chunk {
                prefix: true,
                data: &entries[i][..CHUNK_LEN - 1],
            })
            .collect();
        let seconds: Vec<Chunk> = two
            .iter()
            .map(|&i| Chunk {
                prefix: false,
                data: &entries[i][CHUNK_LEN - 1..],
            })
            .collect();
        let mut cvs = vec![[0u8; 32]; 2 * two.len()];
        let (left, right) = cvs.split_at_mut(two.len());
        chunks_many(p, &firsts, 0, false, left);
        chunks_many(p, &seconds, 1, false, right);
        let mut roots = vec![[0u8; 32]; two.len()];
        parents_many(p, left, right, true, &mut roots);
        for (&i, h) in two.iter().zip(roots) {
            out[i] = h;
        }
    }
}

/// One chunk of a message: the leaf prefix (when `prefix`) and then `data`; 1 to 1024 bytes in all.
#[derive(Clone, Copy)]
struct Chunk<'a> {
    prefix: bool,
    data: &'a [u8],
}

impl Chunk<'_> {
    fn len(&self) -> usize {
        self.data.len() + usize::from(self.prefix)
    }

    /// Copy the chunk's bytes from position `from` on into `dst` (as many as `dst` holds).
    fn copy_to(&self, from: usize, dst: &mut [u8]) {
        let n = dst.len();
        if n == 0 {
            return;
        }
        if !self.prefix {
            dst.copy_from_slice(&self.data[from..from + n]);
        } else if from == 0 {
            dst[0] = LEAF_PREFIX;
            dst[1..].copy_from_slice(&self.data[..n - 1]);
        } else {
            dst.copy_from_slice(&self.data[from - 1..from - 1 + n]);
        }
    }
}

/// Write to `out` the chaining value of each chunk, all at chunk index `counter`, or its
/// hash when `root` (each chunk is then a whole message). Chunks with as many whole
/// blocks before their last one go through `hash_many` together, and their last blocks
/// (which may be partial, and `hash_many` takes whole blocks only) through [`Last`].
fn chunks_many(p: Platform, chunks: &[Chunk], counter: u64, root: bool, out: &mut [Hash]) {
    // 16 stands for a whole chunk, which `hash_many` hashes to its end.
    let blocks = |c: &Chunk| {
        if c.len() == CHUNK_LEN {
            16
        } else {
            (c.len() - 1) / BLOCK_LEN
        }
    };
    let mut order: Vec<usize> = (0..chunks.len()).collect();
    order.sort_by_key(|&i| blocks(&chunks[i]));
    let mut scratch = Vec::new();
    for same in order.chunk_by(|&a, &b| blocks(&chunks[a]) == blocks(&chunks[b])) {
        for group in same.chunks(LANES) {
            let run = match blocks(&chunks[group[0]]) {
                0 => side_by_side::<0>,
                1 => side_by_side::<64>,
                2 => side_by_side::<128>,
                3 => side_by_side::<192>,
                4 => side_by_side::<256>,
                5 => side_by_side::<320>,
                6 => side_by_side::<384>,
                7 => side_by_side::<448>,
                8 => side_by_side::<512>,
                9 => side_by_side::<576>,
                10 => side_by_side::<640>,
                11 => side_by_side::<704>,
                12 => side_by_side::<768>,
                13 => side_by_side::<832>,
                14 => side_by_side::<896>,
                15 => side_by_side::<960>,
                _ => side_by_side::<1024>,
            };
            run(p, chunks, group, counter, root, &mut scratch, out);
        }
    }
}

/// Compress the first `N` bytes of each chunk of `group` (at most [`LANES`]) side by side,
/// then the rest of each (its last block) through [`Last`]; write the results to `out`.
/// `scratch` holds the copies (kept from call to call, so they are not zeroed each time).
fn side_by_side<const N: usize>(
    p: Platform,
    chunks: &[Chunk],
    group: &[usize],
    counter: u64,
    root: bool,
    scratch: &mut Vec<u8>,
    out: &mut [Hash],
) {
    let k = group.len();
    let root_flag = if root { ROOT } else { 0 };
    let mut cvs = [0u8; 32 * LANES];
    if N > 0 {
        scratch.resize(N * LANES, 0);
        let (copies, _) = scratch.as_chunks_mut::<N>();
        for (copy, &i) in copies.iter_mut().zip(group) {
            chunks[i].copy_to(0, copy);
        }
        let (copies, _) = scratch.as_chunks::<N>();
        let inputs: [&[u8; N]; LANES] = std::array::from_fn(|j| &copies[j]);
        // A whole chunk ends inside `hash_many`; otherwise its last block follows.
        let end = if N == CHUNK_LEN { CHUNK_END | root_flag } else { 0 };
        p.hash_many(
            &inputs[..k],
            &IV,
            counter,
            IncrementCounter::No,
            0,
            CHUNK_START,
            end,
            &mut cvs[..32 * k],
        );
    }
    if N == CHUNK_LEN {
        for (j, &i) in group.iter().enumerate() {
            out[i].copy_from_slice(&cvs[32 * j..32 * (j + 1)]);
        }
        return;
    }
    let mut last = Last::new(p, k);
    for (j, &i) in group.iter().enumerate() {
        let cv = if N == 0 {
            IV
        } else {
            words_from_le_bytes_32(cvs[32 * j..32 * (j + 1)].try_into().expect("32 bytes"))
        };
        let n = chunks[i].len() - N;
        let mut block = [0u8; BLOCK_LEN];
        chunks[i].copy_to(N, &mut block[..n]);
        let start = if N == 0 { CHUNK_START } else { 0 };
        last.push(&cv, &block, n as u8, counter, start | CHUNK_END | root_flag);
    }
    let hashes = last.finish();
    for (j, &i) in group.iter().enumerate() {
        out[i] = hashes[j];
    }
}

/// The last blocks of up to [`LANES`] messages: compressed side by side when there are
/// three or more, else one by one (filling the lanes costs about two blocks' work).
struct Last {
    p: Platform,
    lanes: Option<Blocks>,
    done: Vec<Hash>,
}

impl Last {
    fn new(p: Platform, count: usize) -> Self {
        let lanes = (count >= 3).then(Blocks::default);
        Last {
            p,
            lanes,
            done: Vec::new(),
        }
    }

    fn push(&mut self, cv: &[u32; 8], block: &[u8; BLOCK_LEN], block_len: u8, counter: u64, flags: u8) {
        match &mut self.lanes {
            Some(blocks) => blocks.push(cv, block, block_len, counter, flags),
            None => {
                let mut cv = *cv;
                self.p.compress_in_place(&mut cv, block, block_len, counter, flags);
                self.done.push(le_bytes_from_words_32(&cv));
            }
        }
    }

    /// Return the chaining values (or hashes) in the order pushed.
    fn finish(self) -> [Hash; LANES] {
        let mut out = [[0u8; 32]; LANES];
        match self.lanes {
            Some(mut blocks) => blocks.compress_into(&mut out),
            None => out[..self.done.len()].copy_from_slice(&self.done),
        }
        out
    }
}

/// Write to `out` the parent of each `(left[j], right[j])` pair of chaining values: the
/// root hash when `root`, else the parent's chaining value.
fn parents_many(p: Platform, left: &[Hash], right: &[Hash], root: bool, out: &mut [Hash]) {
    let flags = PARENT | if root { ROOT } else { 0 };
    for ((ls, rs), outs) in left.chunks(LANES).zip(right.chunks(LANES)).zip(out.chunks_mut(LANES)) {
        let k = outs.len();
        let mut blocks = [[0u8; BLOCK_LEN]; LANES];
        for (j, block) in blocks[..k].iter_mut().enumerate() {
            block[..32].copy_from_slice(&ls[j]);
            block[32..].copy_from_slice(&rs[j]);
        }
        let inputs: [&[u8; BLOCK_LEN]; LANES] = std::array::from_fn(|j| &blocks[j]);
        let mut hashes = [0u8; 32 * LANES];
        p.hash_many(
            &inputs[..k],
            &IV,
            0,
            IncrementCounter::No,
            flags,
            0,
            0,
            &mut hashes[..32 * k],
        );
        for (j, slot) in outs.iter_mut().enumerate() {
            slot.copy_from_slice(&hashes[32 * j..32 * (j + 1)]);
        }
    }
}

/// Return the node hash `BLAKE3(0x01 || left || right)`.
pub fn node(left: &Hash, right: &Hash) -> Hash {
    let p = platform();
    let mut cv = IV;
    p.compress_in_place(&mut cv, &first_node_block(left, right), BLOCK_LEN as u8, 0, CHUNK_START);
    finish_node(p, cv, right)
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

/// The first of a node message's two blocks: the prefix, `left`, and all of `right` but its last byte.
fn first_node_block(left: &Hash, right: &Hash) -> [u8; BLOCK_LEN] {
    let mut block = [0u8; BLOCK_LEN];
    block[0] = NODE_PREFIX;
    block[1..33].copy_from_slice(left);
    block[33..].copy_from_slice(&right[..31]);
    block
}

/// Compress a node message's second block (the last byte of `right`) into `cv` and return the hash.
fn finish_node(p: Platform, mut cv: [u32; 8], right: &Hash) -> Hash {
    let mut block = [0u8; BLOCK_LEN];
    block[0] = right[31];
    p.compress_in_place(&mut cv, &block, 1, 0, CHUNK_END | ROOT);
    le_bytes_from_words_32(&cv)
}

/// Write the node hash of each pair of neighbours in `level` to `out`, on the calling
/// thread; `out` has `level.len() / 2` places (an odd last hash is left out).
pub fn pairs_into(level: &[Hash], out: &mut [Hash]) {
    assert_eq!(out.len(), level.len() / 2);
    let p = platform();
    let wide = wide::available();
    for (ins, outs) in level.chunks(2 * LANES).zip(out.chunks_mut(LANES)) {
        let k = outs.len();
        if wide && k >= WIDE_MIN {
            wide::nodes(&ins[..2 * k], outs);
            continue;
        }
        let blocks: [[u8; BLOCK_LEN]; LANES] = std::array::from_fn(|j| {
            if j < k {
                first_node_block(&ins[2 * j], &ins[2 * j + 1])
            } else {
                [0; BLOCK_LEN]
            }
        });
        let inputs: [&[u8; BLOCK_LEN]; LANES] = std::array::from_fn(|j| &blocks[j]);
        let mut cvs = [0u8; 32 * LANES];
        p.hash_many(
            &inputs[..k],
            &IV,
            0,
            IncrementCounter::No,
            0,
            CHUNK_START,
            0,
            &mut cvs[..32 * k],
        );
        let mut last = Last::new(p, k);
        for j in 0..k {
            let cv = words_from_le_bytes_32(cvs[32 * j..32 * (j + 1)].try_into().expect("32 bytes"));
            let mut block = [0u8; BLOCK_LEN];
            block[0] = ins[2 * j + 1][31];
            last.push(&cv, &block, 1, 0, CHUNK_END | ROOT);
        }
        outs.copy_from_slice(&last.finish()[..k]);
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
    fn leaf_equals_blake3_of_the_prefixed_entry_at_every_length_up_to_5_chunks_and_some_longer() {
        for n in 0..5 * CHUNK_LEN + 2 {
            let e = bytes(n, 7);
            assert_eq!(leaf(&e), reference(LEAF_PREFIX, &e), "length {n}");
        }
        for n in [
            16 * CHUNK_LEN - 1,
            16 * CHUNK_LEN,
            17 * CHUNK_LEN + 5,
            33 * CHUNK_LEN - 1,
        ] {
            let e = bytes(n, 9);
            assert_eq!(leaf(&e), reference(LEAF_PREFIX, &e), "length {n}");
        }
    }

    #[test]
    fn leaf_of_a_large_entry_hashed_by_every_core_equals_blake3() {
        for n in [RAYON_ENTRY - 1, RAYON_ENTRY, 5 * RAYON_ENTRY + 3] {
            let e = bytes(n, 3);
            assert_eq!(leaf(&e), reference(LEAF_PREFIX, &e), "length {n}");
        }
    }

    #[test]
    fn leaves_in_a_batch_equal_one_leaf_per_entry_across_lanes_and_lengths() {
        // Mixed lengths, so that groups of equal block counts fill, overflow and part-fill LANES.
        let lens: Vec<usize> = (0..9 * LANES + 5)
            .map(|i| [1024, 1025, 2047, 1500, 0, 3000, 1088, 1087, 63, 64, 127, 1023, 200][i % 13] + i % 3)
            .collect();
        let entries: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| bytes(n, i as u8)).collect();
        let refs: Vec<&[u8]> = entries.iter().map(|e| e.as_slice()).collect();
        let mut out = vec![[0u8; 32]; refs.len()];
        leaves_into(&refs, &mut out);
        for (e, got) in refs.iter().zip(&out) {
            assert_eq!(*got, reference(LEAF_PREFIX, e), "length {}", e.len());
        }
        // And all of them the narrower way, which takes what the wide lanes leave.
        let mut narrow = vec![[0u8; 32]; refs.len()];
        narrow_leaves_into(&refs, &mut narrow);
        assert_eq!(narrow, out);
    }

    #[test]
    fn nodes_one_at_a_time_and_side_by_side_equal_blake3_of_the_prefixed_pair() {
        let level: Vec<Hash> = (0..2 * LANES + 7).map(|i| reference(LEAF_PREFIX, &[i as u8])).collect();
        let mut out = vec![[0u8; 32]; level.len() / 2];
        pairs_into(&level, &mut out);
        for (j, got) in out.iter().enumerate() {
            let (l, r) = (&level[2 * j], &level[2 * j + 1]);
            let want = reference(NODE_PREFIX, &[l.as_slice(), r.as_slice()].concat());
            assert_eq!(*got, want);
            assert_eq!(node(l, r), want);
        }
    }

    #[test]
    fn the_empty_root_is_blake3_of_nothing() {
        assert_eq!(empty(), *blake3::hash(b"").as_bytes());
    }
}
