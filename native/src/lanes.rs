//! BLAKE3's compression function on up to [`LANES`] independent blocks at once.
//!
//! `Platform::hash_many` compresses whole 64-byte blocks of many messages side by side,
//! but the last block of a message may be partial, and each has its own length: a
//! two-chunk leaf ends in a chunk of one byte, a node in a block of one byte. Compressed
//! one at a time they cost about as much as the sixteen whole blocks before them in
//! lanes. Here each block sits in a lane of its own, with its own chaining value, length,
//! counter and flags, and the rounds run on all lanes at once: in AVX-512 registers where
//! the CPU has them, else written for plain arrays (compiled for AVX2 and for the baseline),
//! the best chosen at run time.

use crate::hash::{Hash, IV, LANES};

/// Which message word each of a round's eight G calls takes (the BLAKE3 specification, 2.2).
pub(crate) const MSG_SCHEDULE: [[usize; 16]; 7] = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8],
    [3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1],
    [10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6],
    [12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4],
    [9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7],
    [11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13],
];

/// One word of every lane.
type Word = [u32; LANES];

/// Blocks waiting to be compressed side by side, stored by word: word `w` of lane `j` is `[w][j]`.
#[derive(Default)]
pub struct Blocks {
    cv: [Word; 8],
    msg: [Word; 16],
    /// Counter (low and high words), block length and flags.
    params: [Word; 4],
    len: usize,
}

impl Blocks {
    /// Add a block to the next free lane. Requires a free lane (fewer than [`LANES`] pushed).
    pub fn push(&mut self, cv: &[u32; 8], block: &[u8; 64], block_len: u8, counter: u64, flags: u8) {
        let j = self.len;
        for (w, word) in cv.iter().enumerate() {
            self.cv[w][j] = *word;
        }
        for (w, bytes) in block.chunks_exact(4).enumerate() {
            self.msg[w][j] = u32::from_le_bytes(bytes.try_into().expect("4 bytes"));
        }
        self.params[0][j] = counter as u32;
        self.params[1][j] = (counter >> 32) as u32;
        self.params[2][j] = u32::from(block_len);
        self.params[3][j] = u32::from(flags);
        self.len += 1;
    }

    /// Compress every block pushed and write their chaining values (as bytes), in the order
    /// pushed, to `out`; then empty the lanes.
    pub fn compress_into(&mut self, out: &mut [Hash]) {
        let cv = compress(&self.cv, &self.msg, &self.params);
        for (j, slot) in out[..self.len].iter_mut().enumerate() {
            for (w, word) in cv.iter().enumerate() {
                slot[4 * w..4 * w + 4].copy_from_slice(&word[j].to_le_bytes());
            }
        }
        self.len = 0;
    }
}

type Compress = fn(&[Word; 8], &[Word; 16], &[Word; 4]) -> [Word; 8];

fn compress(cv: &[Word; 8], msg: &[Word; 16], params: &[Word; 4]) -> [Word; 8] {
    // Chosen on every call, not cached behind a `OnceLock` that a forked child could find
    // held: std caches the CPU features in atomics.
    best()(cv, msg, params)
}

/// Return the widest build of the rounds this CPU runs.
fn best() -> Compress {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return |cv, msg, params| {
                // SAFETY: `rounds_avx512` requires nothing but a CPU with AVX-512F, detected above.
                unsafe { rounds_avx512(cv, msg, params) }
            };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return |cv, msg, params| {
                // SAFETY: `rounds_avx2` requires nothing but a CPU with AVX2, detected above.
                unsafe { rounds_avx2(cv, msg, params) }
            };
        }
    }
    rounds
}

/// One round on the AVX-512 state `$v` (sixteen words, a lane per element) with the
/// message words `$m` taken in the order of the schedule row `$s`: the columns, then the
/// diagonals. A macro, not a function, so that a caller unrolling the rounds with constant
/// rows keeps the message words in registers.
#[cfg(target_arch = "x86_64")]
macro_rules! round512 {
    ($v:expr, $m:expr, $s:expr) => {{
        let (v, m, s) = (&mut $v, &$m, $s);
        $crate::lanes::g512(v, [0, 4, 8, 12], m[s[0]], m[s[1]]);
        $crate::lanes::g512(v, [1, 5, 9, 13], m[s[2]], m[s[3]]);
        $crate::lanes::g512(v, [2, 6, 10, 14], m[s[4]], m[s[5]]);
        $crate::lanes::g512(v, [3, 7, 11, 15], m[s[6]], m[s[7]]);
        $crate::lanes::g512(v, [0, 5, 10, 15], m[s[8]], m[s[9]]);
        $crate::lanes::g512(v, [1, 6, 11, 12], m[s[10]], m[s[11]]);
        $crate::lanes::g512(v, [2, 7, 8, 13], m[s[12]], m[s[13]]);
        $crate::lanes::g512(v, [3, 4, 9, 14], m[s[14]], m[s[15]]);
    }};
}
#[cfg(target_arch = "x86_64")]
pub(crate) use round512;

/// The rounds in AVX-512 registers, one lane per 32-bit element, the state in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn rounds_avx512(cv: &[Word; 8], msg: &[Word; 16], params: &[Word; 4]) -> [Word; 8] {
    use std::arch::x86_64::{__m512i, _mm512_loadu_si512, _mm512_set1_epi32, _mm512_storeu_si512, _mm512_xor_si512};
    // SAFETY: a Word is 16 u32s, the 64 bytes an unaligned 512-bit load reads.
    let load = |w: &Word| unsafe { _mm512_loadu_si512(w.as_ptr().cast()) };
    let m: [__m512i; 16] = std::array::from_fn(|i| load(&msg[i]));
    let mut v: [__m512i; 16] = std::array::from_fn(|i| match i {
        0..8 => load(&cv[i]),
        8..12 => _mm512_set1_epi32(IV[i - 8] as i32),
        _ => load(&params[i - 12]),
    });
    for s in &MSG_SCHEDULE {
        round512!(v, m, s);
    }
    let mut out = [[0; LANES]; 8];
    for (w, word) in out.iter_mut().enumerate() {
        // SAFETY: a Word is 16 u32s, the 64 bytes an unaligned 512-bit store writes.
        unsafe { _mm512_storeu_si512(word.as_mut_ptr().cast(), _mm512_xor_si512(v[w], v[w + 8])) };
    }
    out
}

/// The G function on state words `a, b, c, d` of every lane, with message words `x` and `y`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn g512(
    v: &mut [std::arch::x86_64::__m512i; 16],
    [a, b, c, d]: [usize; 4],
    x: std::arch::x86_64::__m512i,
    y: std::arch::x86_64::__m512i,
) {
    use std::arch::x86_64::{_mm512_add_epi32 as add, _mm512_ror_epi32 as ror, _mm512_xor_si512 as xor};
    v[a] = add(add(v[a], v[b]), x);
    v[d] = ror::<16>(xor(v[d], v[a]));
    v[c] = add(v[c], v[d]);
    v[b] = ror::<12>(xor(v[b], v[c]));
    v[a] = add(add(v[a], v[b]), y);
    v[d] = ror::<8>(xor(v[d], v[a]));
    v[c] = add(v[c], v[d]);
    v[b] = ror::<7>(xor(v[b], v[c]));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn rounds_avx2(cv: &[Word; 8], msg: &[Word; 16], params: &[Word; 4]) -> [Word; 8] {
    rounds(cv, msg, params)
}

/// The compression function, lane by lane: seven rounds, then the chaining value
/// (the first half of the state xored with the second).
#[inline(always)]
fn rounds(cv: &[Word; 8], msg: &[Word; 16], params: &[Word; 4]) -> [Word; 8] {
    let mut v: [Word; 16] = [[0; LANES]; 16];
    v[..8].copy_from_slice(cv);
    for (i, iv) in IV[..4].iter().enumerate() {
        v[8 + i] = [*iv; LANES];
    }
    v[12..].copy_from_slice(params);
    for s in &MSG_SCHEDULE {
        // The columns, then the diagonals.
        g(&mut v, [0, 4, 8, 12], &msg[s[0]], &msg[s[1]]);
        g(&mut v, [1, 5, 9, 13], &msg[s[2]], &msg[s[3]]);
        g(&mut v, [2, 6, 10, 14], &msg[s[4]], &msg[s[5]]);
        g(&mut v, [3, 7, 11, 15], &msg[s[6]], &msg[s[7]]);
        g(&mut v, [0, 5, 10, 15], &msg[s[8]], &msg[s[9]]);
        g(&mut v, [1, 6, 11, 12], &msg[s[10]], &msg[s[11]]);
        g(&mut v, [2, 7, 8, 13], &msg[s[12]], &msg[s[13]]);
        g(&mut v, [3, 4, 9, 14], &msg[s[14]], &msg[s[15]]);
    }
    let mut out = [[0; LANES]; 8];
    for (w, word) in out.iter_mut().enumerate() {
        for j in 0..LANES {
            word[j] = v[w][j] ^ v[w + 8][j];
        }
    }
    out
}

/// The G function on state words `a, b, c, d` of every lane, with message words `x` and `y`.
#[inline(always)]
fn g(v: &mut [Word; 16], [a, b, c, d]: [usize; 4], x: &Word, y: &Word) {
    for j in 0..LANES {
        v[a][j] = v[a][j].wrapping_add(v[b][j]).wrapping_add(x[j]);
        v[d][j] = (v[d][j] ^ v[a][j]).rotate_right(16);
        v[c][j] = v[c][j].wrapping_add(v[d][j]);
        v[b][j] = (v[b][j] ^ v[c][j]).rotate_right(12);
        v[a][j] = v[a][j].wrapping_add(v[b][j]).wrapping_add(y[j]);
        v[d][j] = (v[d][j] ^ v[a][j]).rotate_right(8);
        v[c][j] = v[c][j].wrapping_add(v[d][j]);
        v[b][j] = (v[b][j] ^ v[c][j]).rotate_right(7);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blake3::platform::{le_bytes_from_words_32, Platform};

    #[test]
    fn every_build_compresses_each_lane_as_the_crate_compresses_one_block() {
        let mut blocks = Blocks::default();
        let mut want = Vec::new();
        for j in 0..LANES {
            let cv: [u32; 8] = std::array::from_fn(|w| (w as u32 + 1).wrapping_mul(0x9E37_79B9) ^ j as u32);
            let block: [u8; 64] = std::array::from_fn(|i| (i * 7 + j) as u8);
            let (len, counter, flags) = ((j * 5 % 65) as u8, (j as u64) << 33 | j as u64, (j % 16) as u8);
            let mut one = cv;
            Platform::portable().compress_in_place(&mut one, &block, len, counter, flags);
            want.push(le_bytes_from_words_32(&one));
            blocks.push(&cv, &block, len, counter, flags);
        }
        let mut got = vec![[0u8; 32]; LANES];
        blocks.compress_into(&mut got);
        assert_eq!(got, want);
        let lanes = |f: Compress| {
            let out = f(&blocks.cv, &blocks.msg, &blocks.params);
            (0..LANES)
                .map(|j| {
                    let words: [u32; 8] = std::array::from_fn(|w| out[w][j]);
                    le_bytes_from_words_32(&words)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(lanes(rounds), want);
        assert_eq!(lanes(best()), want);
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 was just detected.
                assert_eq!(lanes(|cv, msg, params| unsafe { rounds_avx2(cv, msg, params) }), want);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: AVX-512F was just detected.
                assert_eq!(lanes(|cv, msg, params| unsafe { rounds_avx512(cv, msg, params) }), want);
            }
        }
    }
}
