//! Whole BLAKE3 hashes of sixteen messages side by side, one message per AVX-512 lane.
//!
//! `Platform::hash_many` takes whole blocks from memory, so a leaf (`0x00 || entry`) must
//! first be copied to shift its entry by the prefix byte, and the partial last blocks and
//! the parents of each leaf's chunks go through other, narrower paths. Here every lane
//! runs one message from its first block to its root, each block loaded straight from the
//! entry one byte back (the first block's load masks off the byte before the entry and
//! takes the prefix instead; the last block's masks off the bytes after it), and the
//! chunk chaining values and their parents stay in registers. The messages of one call have the same number of
//! blocks, so every lane takes the same steps; only the last block's length differs.
//!
//! A node `0x01 || left || right` is 65 bytes: its sixteen pairs are read as they lie
//! (a pair of neighbours is 64 contiguous bytes) and shifted by the prefix byte in registers.

use crate::hash::{Hash, LANES};

/// The most bytes a message hashed here may have: its chunks' chaining values wait on a
/// stack of at most [`STACK`] entries (the bits of its chunk count).
pub const MAX_MESSAGE: usize = CHUNK_LEN << (STACK - 1);
const STACK: usize = 12;
const BLOCK_LEN: usize = 64;
const CHUNK_LEN: usize = 1024;

/// Whether this CPU runs the lanes here (AVX-512F and BW); the callers hash otherwise when not.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // No `OnceLock` (a child forked while it is being filled would wait forever): std
        // caches the features in atomics.
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Return the number of 64-byte blocks of a message of `len` bytes (an empty one has one).
pub fn blocks(len: usize) -> usize {
    len.div_ceil(BLOCK_LEN).max(1)
}

/// Write `BLAKE3(prefix || data[j])` to `out[j]` for each message `data[j]`.
///
/// Requires [`available`], `1 <= data.len() == out.len() <= LANES`, and every
/// `prefix || data[j]` of the same [`blocks`] count and at most [`MAX_MESSAGE`] bytes.
pub fn prefixed(prefix: u8, data: &[&[u8]], out: &mut [Hash]) {
    assert!(available() && !data.is_empty() && data.len() <= LANES && data.len() == out.len());
    let n = blocks(data[0].len() + 1);
    assert!(data.iter().all(|d| blocks(d.len() + 1) == n && d.len() < MAX_MESSAGE));
    #[cfg(target_arch = "x86_64")]
    {
        // Lanes past the messages repeat the first one; their hashes are not kept.
        let lanes: [&[u8]; LANES] = std::array::from_fn(|j| data.get(j).copied().unwrap_or(data[0]));
        match <&mut [Hash; LANES]>::try_from(&mut *out) {
            // SAFETY: AVX-512F and BW are available (asserted), and every message has `n` blocks.
            Ok(all) => unsafe { x86::prefixed(prefix, &lanes, n, all) },
            Err(_) => {
                let mut hashes = [[0u8; 32]; LANES];
                // SAFETY: as above.
                unsafe { x86::prefixed(prefix, &lanes, n, &mut hashes) };
                out.copy_from_slice(&hashes[..out.len()]);
            }
        }
    }
}

/// Write `BLAKE3(0x01 || level[2j] || level[2j + 1])` to `out[j]` for each `j`.
///
/// Requires [`available`], `1 <= out.len() <= LANES` and `level.len() == 2 * out.len()`.
pub fn nodes(level: &[Hash], out: &mut [Hash]) {
    assert!(available() && !out.is_empty() && out.len() <= LANES && level.len() == 2 * out.len());
    #[cfg(target_arch = "x86_64")]
    {
        let pairs: [&[Hash]; LANES] = std::array::from_fn(|j| {
            let j = if j < out.len() { j } else { 0 };
            &level[2 * j..2 * j + 2]
        });
        match <&mut [Hash; LANES]>::try_from(&mut *out) {
            // SAFETY: AVX-512F and BW are available (asserted), and every pair is two hashes.
            Ok(all) => unsafe { x86::nodes(&pairs, all) },
            Err(_) => {
                let mut hashes = [[0u8; 32]; LANES];
                // SAFETY: as above.
                unsafe { x86::nodes(&pairs, &mut hashes) };
                out.copy_from_slice(&hashes[..out.len()]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{BLOCK_LEN, CHUNK_LEN, STACK};
    use crate::hash::{Hash, IV, LANES, NODE_PREFIX};
    use crate::lanes::{round512, MSG_SCHEDULE};

    const CHUNK_START: u32 = 1 << 0;
    const CHUNK_END: u32 = 1 << 1;
    const PARENT: u32 = 1 << 2;
    const ROOT: u32 = 1 << 3;
    const BLOCKS_PER_CHUNK: usize = CHUNK_LEN / BLOCK_LEN;

    type Cv = [__m512i; 8];

    #[target_feature(enable = "avx512f,avx512bw")]
    fn splat(x: u32) -> __m512i {
        _mm512_set1_epi32(x as i32)
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    fn iv() -> Cv {
        std::array::from_fn(|i| splat(IV[i]))
    }

    /// Compress one block in every lane: `m` holds word `w` of each lane's block in `m[w]`.
    #[target_feature(enable = "avx512f,avx512bw")]
    fn compress(cv: &Cv, m: &[__m512i; 16], counter: u64, block_len: __m512i, flags: u32) -> Cv {
        let mut v: [__m512i; 16] = std::array::from_fn(|i| match i {
            0..8 => cv[i],
            8..12 => splat(IV[i - 8]),
            12 => splat(counter as u32),
            13 => splat((counter >> 32) as u32),
            14 => block_len,
            _ => splat(flags),
        });
        // Written out round by round: with the schedule's indices constant, the message
        // words stay in registers instead of being looked up in memory every round.
        round512!(v, m, &MSG_SCHEDULE[0]);
        round512!(v, m, &MSG_SCHEDULE[1]);
        round512!(v, m, &MSG_SCHEDULE[2]);
        round512!(v, m, &MSG_SCHEDULE[3]);
        round512!(v, m, &MSG_SCHEDULE[4]);
        round512!(v, m, &MSG_SCHEDULE[5]);
        round512!(v, m, &MSG_SCHEDULE[6]);
        std::array::from_fn(|i| _mm512_xor_si512(v[i], v[i + 8]))
    }

    /// The parent of two chaining values in every lane.
    #[target_feature(enable = "avx512f,avx512bw")]
    fn parent(left: &Cv, right: &Cv, flags: u32) -> Cv {
        let m: [__m512i; 16] = std::array::from_fn(|i| if i < 8 { left[i] } else { right[i - 8] });
        compress(&iv(), &m, 0, splat(BLOCK_LEN as u32), PARENT | flags)
    }

    /// Turn sixteen rows (one lane's 16 words each) into sixteen words (one per lane each).
    #[target_feature(enable = "avx512f,avx512bw")]
    fn transpose(r: [__m512i; 16]) -> [__m512i; 16] {
        // Interleave 32-bit, then 64-bit, then twice 128-bit elements.
        let a: [__m512i; 16] = std::array::from_fn(|i| {
            let (x, y) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_epi32(x, y)
            } else {
                _mm512_unpackhi_epi32(x, y)
            }
        });
        // a[2p] holds elements 0/0/1/1 of rows 2p, 2p+1 per 128 bits; a[2p + 1] elements 2/2/3/3.
        let b: [__m512i; 16] = std::array::from_fn(|i| {
            let (q, k) = (i / 4, i % 4);
            let (x, y) = (a[4 * q + (k / 2)], a[4 * q + 2 + (k / 2)]);
            if k % 2 == 0 {
                _mm512_unpacklo_epi64(x, y)
            } else {
                _mm512_unpackhi_epi64(x, y)
            }
        });
        // b[4q + k]: element k of each 128-bit part, rows 4q..4q+4.
        let c: [__m512i; 16] = std::array::from_fn(|i| {
            let (h, t) = (i / 8, i % 8);
            let (x, y) = (b[8 * h + (t % 4)], b[8 * h + 4 + (t % 4)]);
            if t < 4 {
                _mm512_shuffle_i32x4::<0x88>(x, y)
            } else {
                _mm512_shuffle_i32x4::<0xdd>(x, y)
            }
        });
        std::array::from_fn(|i| {
            let (x, y) = (c[i % 8], c[8 + i % 8]);
            if i < 8 {
                _mm512_shuffle_i32x4::<0x88>(x, y)
            } else {
                _mm512_shuffle_i32x4::<0xdd>(x, y)
            }
        })
    }

    /// Load a 64-byte row from `p`.
    ///
    /// # Safety
    /// `p` must point to 64 readable bytes.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn row(p: *const u8) -> __m512i {
        // SAFETY: the caller's promise; the load is unaligned.
        unsafe { _mm512_loadu_si512(p.cast()) }
    }

    /// Write the 32-byte hash in each lane of `cv` to `out`.
    #[target_feature(enable = "avx512f,avx512bw")]
    fn hashes(cv: &Cv, out: &mut [Hash; LANES]) {
        let zero = _mm512_setzero_si512();
        let rows = transpose(std::array::from_fn(|i| if i < 8 { cv[i] } else { zero }));
        for (h, r) in out.iter_mut().zip(rows) {
            // SAFETY: a hash is 32 bytes, the low half of the row the store writes.
            unsafe { _mm256_storeu_si256(h.as_mut_ptr().cast(), _mm512_castsi512_si256(r)) };
        }
    }

    /// Load bytes `from..to` of 64 at `p` into the same places of a row, zeros elsewhere.
    ///
    /// # Safety
    /// Bytes `p + from .. p + to` must be readable (the others are not read).
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn part(p: *const u8, from: usize, to: usize) -> __m512i {
        let mask = if to - from == 64 {
            u64::MAX
        } else {
            ((1u64 << (to - from)) - 1) << from
        };
        // SAFETY: the caller's promise; masked-off bytes are not accessed.
        unsafe { _mm512_maskz_loadu_epi8(mask, p.cast()) }
    }

    /// Write the hashes of `prefix || data[j]` to `out`, every message of `n` blocks.
    ///
    /// # Safety
    /// AVX-512F and BW must be available, and every `prefix || data[j]` must have `n` blocks and
    /// fewer than `MAX_MESSAGE` bytes (so that its chaining values fit the stack).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn prefixed(prefix: u8, data: &[&[u8]; LANES], n: usize, out: &mut [Hash; LANES]) {
        // Each lane's last block has its own length (from 1 to 64 bytes).
        let last_len: [u32; LANES] = std::array::from_fn(|j| (data[j].len() + 1 - BLOCK_LEN * (n - 1)) as u32);
        // SAFETY: last_len is 16 u32s, the 64 bytes the load reads.
        let last_len = unsafe { _mm512_loadu_si512(last_len.as_ptr().cast()) };
        let prefix = _mm512_maskz_mov_epi32(1, splat(u32::from(prefix)));
        let full = splat(BLOCK_LEN as u32);
        let chunks = n.div_ceil(BLOCKS_PER_CHUNK);
        let mut stack = [[_mm512_setzero_si512(); 8]; STACK];
        let mut depth = 0;
        for c in 0..chunks {
            let (b0, b1) = (c * BLOCKS_PER_CHUNK, n.min((c + 1) * BLOCKS_PER_CHUNK));
            let mut cv = iv();
            for b in b0..b1 {
                // Block b of a message is bytes 64b-1 .. 64b+63 of its entry (the prefix
                // takes the first place): the first block leaves out the byte before the
                // entry, the last the bytes after it, and the prefix goes in by itself.
                let rows: [__m512i; LANES] = std::array::from_fn(|j| {
                    let d = data[j];
                    let at = d.as_ptr().wrapping_add(BLOCK_LEN * b).wrapping_sub(1);
                    let end = (d.len() + 1 - BLOCK_LEN * b).min(BLOCK_LEN);
                    // SAFETY: the bytes read are the entry's (64b-1 .. 64b+63 within it).
                    unsafe {
                        if b == 0 {
                            _mm512_or_si512(part(at, 1, end), prefix)
                        } else if b == n - 1 {
                            part(at, 0, end)
                        } else {
                            row(at)
                        }
                    }
                });
                let mut flags = 0;
                if b == b0 {
                    flags |= CHUNK_START;
                }
                if b == b1 - 1 {
                    flags |= CHUNK_END;
                    if chunks == 1 {
                        flags |= ROOT;
                    }
                }
                // The lanes read sixteen places at once, and the hardware prefetcher takes
                // a while to follow each: over the first two chunks (all of a message of
                // 1 KiB; a long one's stream is followed by then) ask for each lane's block
                // after next while this one is compressed. Per core, 1 KiB leaves: 0.59 of
                // blake3::hash without, 0.71 with; asked for all along, 16 KiB leaves lose 4%.
                if b + 2 < n && b < 2 * BLOCKS_PER_CHUNK {
                    for d in data {
                        let p = d.as_ptr().wrapping_add(BLOCK_LEN * (b + 2) - 1);
                        _mm_prefetch::<_MM_HINT_T0>(p.cast());
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(BLOCK_LEN - 1).cast());
                    }
                }
                let len = if b == n - 1 { last_len } else { full };
                cv = compress(&cv, &transpose(rows), c as u64, len, flags);
            }
            if c + 1 < chunks {
                // More chunks follow: merge every completed subtree (the trailing zero bits
                // of the chunks so far), as BLAKE3's own chunk stack does.
                let mut total = c + 1;
                while total & 1 == 0 {
                    depth -= 1;
                    cv = parent(&stack[depth], &cv, 0);
                    total >>= 1;
                }
                stack[depth] = cv;
                depth += 1;
            } else {
                // The last chunk: fold the stack into it, right to left, the root last.
                while depth > 0 {
                    depth -= 1;
                    cv = parent(&stack[depth], &cv, if depth == 0 { ROOT } else { 0 });
                }
                hashes(&cv, out);
            }
        }
    }

    /// The node hashes of sixteen pairs of child hashes.
    ///
    /// # Safety
    /// AVX-512F and BW must be available, and every `pairs[j]` must be two hashes.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn nodes(pairs: &[&[Hash]; LANES], out: &mut [Hash; LANES]) {
        // SAFETY: two hashes are 64 contiguous bytes.
        let x = transpose(std::array::from_fn(|j| unsafe { row(pairs[j].as_ptr().cast()) }));
        // The message is the prefix byte and then the pair: each word of the first block
        // is the pair's bytes moved up one place, the top byte of the word before coming in.
        let first: [__m512i; 16] = std::array::from_fn(|w| {
            let low = if w == 0 {
                splat(u32::from(NODE_PREFIX))
            } else {
                _mm512_srli_epi32::<24>(x[w - 1])
            };
            _mm512_or_si512(_mm512_slli_epi32::<8>(x[w]), low)
        });
        let second: [__m512i; 16] = std::array::from_fn(|w| {
            if w == 0 {
                _mm512_srli_epi32::<24>(x[15])
            } else {
                _mm512_setzero_si512()
            }
        });
        let cv = compress(&iv(), &first, 0, splat(BLOCK_LEN as u32), CHUNK_START);
        let cv = compress(&cv, &second, 0, splat(1), CHUNK_END | ROOT);
        hashes(&cv, out);
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

    fn bytes(n: usize, seed: usize) -> Vec<u8> {
        (0..n)
            .map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7)) as u8)
            .collect()
    }

    #[test]
    fn sixteen_messages_of_a_block_count_hash_as_blake3_of_each_prefixed_message() {
        if !available() {
            return;
        }
        // Every block count up to three chunks and a half, each lane a different length
        // with that count (so that last blocks differ), full and part-filled lanes; then
        // counts whose chunks leave one, two or many subtrees on the stack.
        let counts = (1..=56).chain([64, 65, 256, 257, 273, 1024, 1025, 2049]);
        for n in counts {
            let lens: Vec<usize> = (0..LANES)
                .map(|j| {
                    let lo = if n == 1 { 0 } else { 64 * (n - 1) };
                    let span = 64 * n - 1 - lo;
                    lo + (j * 13) % (span + 1)
                })
                .collect();
            let entries: Vec<Vec<u8>> = lens.iter().enumerate().map(|(j, &l)| bytes(l, j + n)).collect();
            let refs: Vec<&[u8]> = entries.iter().map(|e| e.as_slice()).collect();
            for k in [LANES, 1, 7] {
                let mut out = vec![[0u8; 32]; k];
                prefixed(0x00, &refs[..k], &mut out);
                for (e, got) in refs.iter().zip(&out) {
                    assert_eq!(*got, reference(0x00, e), "{n} blocks, length {}", e.len());
                }
            }
        }
    }

    #[test]
    fn sixteen_nodes_hash_as_blake3_of_each_prefixed_pair() {
        if !available() {
            return;
        }
        let level: Vec<Hash> = (0..2 * LANES).map(|i| reference(0x00, &bytes(i, i))).collect();
        for k in [LANES, 1, 9] {
            let mut out = vec![[0u8; 32]; k];
            nodes(&level[..2 * k], &mut out);
            for (j, got) in out.iter().enumerate() {
                assert_eq!(*got, reference(0x01, &[level[2 * j], level[2 * j + 1]].concat()));
            }
        }
    }

    /// Pages of memory with an unreadable page on each side, so that a read of a byte
    /// before or after what is placed at either end faults.
    #[cfg(target_os = "linux")]
    struct Guarded {
        base: *mut u8,
        len: usize,
    }

    #[cfg(target_os = "linux")]
    impl Guarded {
        const PAGE: usize = 4096;

        fn new(pages: usize) -> Self {
            extern "C" {
                fn mmap(addr: *mut u8, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut u8;
                fn mprotect(addr: *mut u8, len: usize, prot: i32) -> i32;
            }
            const PROT_NONE: i32 = 0;
            const PROT_RW: i32 = 1 | 2;
            const MAP_PRIVATE_ANONYMOUS: i32 = 0x02 | 0x20;
            let len = (pages + 2) * Self::PAGE;
            // SAFETY: a fresh private anonymous mapping; its first and last pages are made
            // unreadable, and only the pages between are ever handed out.
            unsafe {
                let base = mmap(std::ptr::null_mut(), len, PROT_RW, MAP_PRIVATE_ANONYMOUS, -1, 0);
                assert!(!base.is_null() && base as isize != -1, "mmap");
                assert_eq!(mprotect(base, Self::PAGE, PROT_NONE), 0);
                assert_eq!(mprotect(base.add(len - Self::PAGE), Self::PAGE, PROT_NONE), 0);
                Guarded { base, len }
            }
        }

        /// The readable pages.
        fn inner(&mut self) -> &mut [u8] {
            // SAFETY: the pages between the guards are mapped readable and writable, and
            // borrowed from `self` exclusively.
            unsafe { std::slice::from_raw_parts_mut(self.base.add(Self::PAGE), self.len - 2 * Self::PAGE) }
        }
    }

    #[cfg(target_os = "linux")]
    impl Drop for Guarded {
        fn drop(&mut self) {
            extern "C" {
                fn munmap(addr: *mut u8, len: usize) -> i32;
            }
            // SAFETY: the mapping made in `new`, no longer borrowed.
            unsafe { munmap(self.base, self.len) };
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn messages_right_after_and_right_before_unreadable_pages_are_read_only_within() {
        if !available() {
            return;
        }
        // Every entry length up to 66 blocks, and some longer, in every lane, placed once
        // at the end of readable memory and once at its start: a load of a byte outside
        // the entry (the one before the first block, those after the last) would fault.
        let mut regions: Vec<Guarded> = (0..LANES)
            .map(|_| Guarded::new(MAX_TEST.div_ceil(Guarded::PAGE)))
            .collect();
        const MAX_TEST: usize = 64 * 1024 + 64;
        let counts = (1..=66).chain([256, 257, 1024, 1025]);
        for n in counts {
            let (lo, hi) = if n == 1 { (0, 63) } else { (64 * (n - 1), 64 * n - 1) };
            let span = hi - lo + 1;
            let turns: Vec<usize> = if n <= 66 {
                (0..span).collect()
            } else {
                vec![0, 1, span - 1]
            };
            for t in turns {
                for at_end in [true, false] {
                    let refs: Vec<&[u8]> = regions
                        .iter_mut()
                        .enumerate()
                        .map(|(j, r)| {
                            let len = lo + (t + 5 * j) % span;
                            let inner = r.inner();
                            let from = if at_end { inner.len() - len } else { 0 };
                            let e = &mut inner[from..from + len];
                            for (i, b) in e.iter_mut().enumerate() {
                                *b = (i.wrapping_mul(31) + j + n) as u8;
                            }
                            &*e
                        })
                        .collect();
                    let mut out = [[0u8; 32]; LANES];
                    prefixed(0x00, &refs, &mut out);
                    for (e, got) in refs.iter().zip(&out) {
                        assert_eq!(*got, reference(0x00, e), "{n} blocks, length {}", e.len());
                    }
                }
            }
        }
        // Nodes: pairs that end and start at the guards.
        let inner = regions[0].inner();
        let n = inner.len();
        let level: Vec<Hash> = (0..2 * LANES).map(|i| reference(0x00, &bytes(i, i))).collect();
        for at_end in [true, false] {
            let from = if at_end { n - 64 * LANES } else { 0 };
            let lie = &mut inner[from..from + 64 * LANES];
            for (dst, h) in lie.chunks_exact_mut(32).zip(&level) {
                dst.copy_from_slice(h);
            }
            // SAFETY: 64 * LANES bytes are 2 * LANES hashes, each of alignment 1.
            let placed: &[Hash] = unsafe { std::slice::from_raw_parts(lie.as_ptr().cast(), 2 * LANES) };
            let mut out = [[0u8; 32]; LANES];
            nodes(placed, &mut out);
            for (j, got) in out.iter().enumerate() {
                assert_eq!(*got, reference(0x01, &[level[2 * j], level[2 * j + 1]].concat()));
            }
        }
    }
}
