//! RFC 9162 Merkle trees over the hashes of `hash.rs`: roots, span roots, proofs, their
//! verification, and the frontier of a growing tree.
//!
//! The same algorithms, step for step, as `compactstore/merkle_pure.py`, which is the
//! reference: a subtree `(level, index)` covers positions `[index << level, (index + 1) << level)`.
//! Large inputs are split over every core (`par.rs`); small ones stay on the caller's thread.

use crate::hash::{self, Hash};
use crate::par;

/// A complete aligned subtree: `(level, index)`.
pub type Coord = (u32, u64);

/// From this much work (block compressions, `hash::leaf_cost`; a node is two), hashing is
/// spread over every core: for less, starting a thread costs more than the share of the
/// work it takes off the caller.
const PAR_WORK: usize = 2048;
const PAR_NODES: usize = PAR_WORK / 2;
/// Work per task: small enough that a core that starts late takes fewer tasks, large
/// enough that claiming one costs nothing. A power of two of nodes, so that tasks over
/// leaf hashes are aligned subtrees.
const TASK_WORK: usize = 1024;
const TASK_NODES: usize = TASK_WORK / 2;
/// The fewest entries in a task, so that a task of long entries is a subtree of some height.
const TASK_MIN: usize = 16;

/// Return the leaf hash of each entry, in order.
pub fn leaves(entries: &[&[u8]]) -> Vec<Hash> {
    let mut out = vec![[0u8; 32]; entries.len()];
    let total = work(entries);
    if total < PAR_WORK || entries.len() < 2 {
        hash::leaves_into(entries, &mut out);
    } else {
        let per = task_len(entries.len(), total);
        par::chunks_mut(&mut out, per, |i, o| {
            hash::leaves_into(&entries[i * per..][..o.len()], o)
        });
    }
    out
}

/// Return the work of hashing `entries` as leaves, in block compressions.
fn work(entries: &[&[u8]]) -> usize {
    entries.iter().map(|e| hash::leaf_cost(e.len())).sum()
}

/// Return how many entries one task takes: about [`TASK_WORK`], at least [`TASK_MIN`],
/// and a power of two (so that tasks are aligned subtrees).
fn task_len(count: usize, total: usize) -> usize {
    let average = total / count.max(1);
    (TASK_WORK / average.max(1)).max(TASK_MIN).next_power_of_two()
}

/// Return the next level up: neighbours paired, an odd last hash dropped.
pub fn pairs(level: &[Hash]) -> Vec<Hash> {
    let mut out = vec![[0u8; 32]; level.len() / 2];
    if out.len() < PAR_NODES {
        hash::pairs_into(level, &mut out);
    } else {
        par::chunks_mut(&mut out, TASK_NODES, |i, o| {
            hash::pairs_into(&level[2 * TASK_NODES * i..][..2 * o.len()], o);
        });
    }
    out
}

/// Return the RFC 9162 root over leaf hashes on the calling thread.
fn root_here(leaves: &[Hash]) -> Hash {
    let Some(last) = leaves.last() else {
        return hash::empty();
    };
    if leaves.len() == 1 {
        return *last;
    }
    // Pairing bottom-up with the odd node carried gives the same tree as RFC 9162's
    // recursive split at the largest power of two.
    let mut level = up(leaves);
    while level.len() > 1 {
        level = up(&level);
    }
    level[0]
}

fn up(level: &[Hash]) -> Vec<Hash> {
    let mut out = vec![[0u8; 32]; level.len().div_ceil(2)];
    let whole = level.len() / 2;
    hash::pairs_into(level, &mut out[..whole]);
    if level.len() % 2 == 1 {
        out[whole] = level[level.len() - 1];
    }
    out
}

/// Return the RFC 9162 root over leaf hashes (not entries).
pub fn root_of_leaves(leaves: &[Hash]) -> Hash {
    if leaves.len() < PAR_NODES {
        return root_here(leaves);
    }
    // Aligned blocks of a power of two are complete subtrees (the last one the root of
    // what is left), and the root over their roots is the root over all.
    let roots = par::map(leaves.len().div_ceil(TASK_NODES), |i| {
        root_here(&leaves[i * TASK_NODES..leaves.len().min((i + 1) * TASK_NODES)])
    });
    root_here(&roots)
}

/// Return the RFC 9162 Merkle Tree Hash of `entries`.
pub fn tree_root(entries: &[&[u8]]) -> Hash {
    let total = work(entries);
    if total < PAR_WORK || entries.len() < 2 {
        return root_of_leaves(&leaves(entries));
    }
    // Each task hashes its entries and their subtree while they are in its cache.
    let per = task_len(entries.len(), total);
    let roots = par::map(entries.len().div_ceil(per), |i| {
        let chunk = &entries[i * per..entries.len().min((i + 1) * per)];
        let mut own = vec![[0u8; 32]; chunk.len()];
        hash::leaves_into(chunk, &mut own);
        root_here(&own)
    });
    root_here(&roots)
}

/// Return the roots of every complete aligned subtree over leaf hashes, level by level.
pub fn subtree_levels(leaves: &[Hash]) -> Vec<Vec<Hash>> {
    let mut levels = vec![leaves.to_vec()];
    while levels[levels.len() - 1].len() > 1 {
        let next = pairs(&levels[levels.len() - 1]);
        levels.push(next);
    }
    levels
}

/// Return the root of a compact range's hashes (left to right), merged right to left.
pub fn fold(hashes: &[Hash]) -> Hash {
    let Some((last, rest)) = hashes.split_last() else {
        return hash::empty();
    };
    rest.iter().rev().fold(*last, |acc, left| hash::node(left, &acc))
}

/// Return the largest power of two smaller than `n` (RFC 9162's k). Requires `n > 1`.
fn split(n: u64) -> u64 {
    1 << (63 - (n - 1).leading_zeros())
}

/// Return the compact range of `[start, stop)`: its fewest aligned complete subtrees, left to right.
pub fn cover(mut start: u64, stop: u64) -> Vec<Coord> {
    let mut out = Vec::new();
    while start < stop {
        // The largest subtree aligned at `start` (its trailing zero bits) that fits.
        let mut level = 63 - (stop - start).leading_zeros();
        if start != 0 {
            level = level.min(start.trailing_zeros());
        }
        out.push((level, start >> level));
        start += 1 << level;
    }
    out
}

/// Return the spans whose roots form the inclusion proof of `index` in `size`, from the
/// leaf's sibling up. Requires `index < size`.
pub fn inclusion_spans(index: u64, size: u64) -> Vec<(u64, u64)> {
    let mut path = Vec::new();
    let (mut lo, mut hi) = (0, size);
    while hi - lo > 1 {
        let k = split(hi - lo);
        if index < lo + k {
            path.push((lo + k, hi));
            hi = lo + k;
        } else {
            path.push((lo, lo + k));
            lo += k;
        }
    }
    path.reverse();
    path
}

/// Return the spans whose roots form the consistency proof from `old_size` to `new_size`
/// (RFC 9162 SUBPROOF). Requires `old_size <= new_size`.
pub fn consistency_spans(old_size: u64, new_size: u64) -> Vec<(u64, u64)> {
    if old_size == 0 || old_size == new_size {
        return Vec::new();
    }
    let (mut lo, mut hi, mut complete) = (0, new_size, true);
    let mut tail = Vec::new();
    while old_size != hi {
        let k = split(hi - lo);
        if old_size <= lo + k {
            tail.push((lo + k, hi));
            hi = lo + k;
        } else {
            tail.push((lo, lo + k));
            lo += k;
            complete = false;
        }
    }
    let mut out = if complete { Vec::new() } else { vec![(lo, hi)] };
    out.extend(tail.into_iter().rev());
    out
}

/// Return the root of positions `[start, stop)` from leaf hashes, `leaves[0]` being the
/// leaf of position `first`. Requires `first <= start <= stop <= first + leaves.len()`.
pub fn span_root_of_leaves(leaves: &[Hash], start: u64, stop: u64, first: u64) -> Hash {
    let pieces: Vec<Hash> = cover(start, stop)
        .into_iter()
        .map(|(level, index)| {
            let a = ((index << level) - first) as usize;
            root_of_leaves(&leaves[a..a + (1usize << level)])
        })
        .collect();
    fold(&pieces)
}

/// Return the root of each span, from every level of the tree (as [`subtree_levels`] gives).
pub fn spans_root(levels: &[Vec<Hash>], spans: &[(u64, u64)]) -> Vec<Hash> {
    spans
        .iter()
        .map(|&(a, b)| {
            let pieces: Vec<Hash> = cover(a, b)
                .into_iter()
                .map(|(level, index)| levels[level as usize][index as usize])
                .collect();
            fold(&pieces)
        })
        .collect()
}

/// Return the root that `proof` implies for leaf hash `leaf` at `index` in a tree of
/// `size` (RFC 9162 section 2.1.3.2), or None when it cannot be a valid proof.
pub fn root_from_inclusion(leaf: &Hash, index: u64, size: u64, proof: &[Hash]) -> Option<Hash> {
    if index >= size {
        return None;
    }
    let (mut fn_, mut sn, mut r) = (index, size - 1, *leaf);
    for p in proof {
        if sn == 0 {
            return None;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = hash::node(p, &r);
            if fn_ & 1 == 0 {
                while fn_ != 0 && fn_ & 1 == 0 {
                    fn_ >>= 1;
                    sn >>= 1;
                }
            }
        } else {
            r = hash::node(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    (sn == 0).then_some(r)
}

/// Return whether `proof` shows the tree `(old_size, old_root)` is a prefix of
/// `(new_size, new_root)` (RFC 9162 section 2.1.4.2, with the trivial cases).
pub fn verify_consistency(old_size: u64, new_size: u64, old_root: &Hash, new_root: &Hash, proof: &[Hash]) -> bool {
    if old_size > new_size {
        return false;
    }
    if old_size == 0 {
        let empty = hash::empty();
        return proof.is_empty() && *old_root == empty && (new_size > 0 || *new_root == empty);
    }
    if old_size == new_size {
        return proof.is_empty() && old_root == new_root;
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old_size.is_power_of_two() {
        // The old root is the first node of the path.
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    let (mut fn_, mut sn) = (old_size - 1, new_size - 1);
    while fn_ & 1 == 1 {
        fn_ >>= 1;
        sn >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if sn == 0 {
            return false;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            fr = hash::node(c, &fr);
            sr = hash::node(c, &sr);
            if fn_ & 1 == 0 {
                while fn_ != 0 && fn_ & 1 == 0 {
                    fn_ >>= 1;
                    sn >>= 1;
                }
            }
        } else {
            sr = hash::node(&sr, c);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    sn == 0 && fr == *old_root && sr == *new_root
}

/// Add leaf hashes `leaves` to the frontier `hashes` of a tree of `size` leaves (the roots
/// of `cover(0, size)`), and return the completed subtrees as `(level, index, root)`: level
/// by level from the lowest, left to right, only at levels that are multiples of `every`.
/// Requires `every >= 1`.
pub fn extend(hashes: &mut Vec<Hash>, size: u64, leaves: &[Hash], every: u32) -> Vec<(u32, u64, Hash)> {
    let mut made = Vec::new();
    // An unpaired last root per level, lowest level first.
    let mut kept: Vec<Hash> = Vec::new();
    let mut cur: Vec<Hash> = leaves.to_vec();
    let mut level: u32 = 0;
    while !cur.is_empty() {
        let mut first = size >> level;
        if first & 1 == 1 {
            // The frontier's root at this level is the left sibling of cur[0].
            cur.insert(0, hashes.pop().expect("a frontier root for each 1-bit of the size"));
            first -= 1;
        }
        if cur.len() % 2 == 1 {
            kept.push(cur.pop().expect("not empty"));
        }
        cur = pairs(&cur);
        level += 1;
        first >>= 1;
        if level.is_multiple_of(every) {
            made.extend(cur.iter().enumerate().map(|(j, h)| (level, first + j as u64, *h)));
        }
    }
    hashes.extend(kept.into_iter().rev());
    made
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::{leaf, node};

    /// RFC 9162's MTH, recursively, as the RFC writes it.
    fn mth(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => hash::empty(),
            1 => leaves[0],
            n => {
                let k = split(n as u64) as usize;
                node(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    fn some_leaves(n: usize) -> Vec<Hash> {
        (0..n).map(|i| leaf(&(i as u64).to_be_bytes())).collect()
    }

    #[test]
    fn root_of_leaves_equals_the_recursive_mth_at_every_size_up_to_70_and_past_the_parallel_cut() {
        for n in (0..70).chain([PAR_NODES - 1, PAR_NODES, 3 * TASK_NODES + 5]) {
            let ls = some_leaves(n);
            assert_eq!(root_of_leaves(&ls), mth(&ls), "size {n}");
        }
    }

    #[test]
    fn tree_root_over_entries_equals_the_root_over_their_leaves_in_one_or_many_tasks() {
        for (count, len) in [(0, 0), (1, 5), (37, 1024), (300, 1024), (1000, 200), (77, 16 * 1024)] {
            let entries: Vec<Vec<u8>> = (0..count).map(|i| vec![i as u8; len + i % 3]).collect();
            let refs: Vec<&[u8]> = entries.iter().map(|e| e.as_slice()).collect();
            let ls: Vec<Hash> = refs.iter().map(|e| leaf(e)).collect();
            assert_eq!(leaves(&refs), ls);
            assert_eq!(tree_root(&refs), mth(&ls), "{count} entries of {len}");
        }
    }

    #[test]
    fn cover_tiles_a_span_with_aligned_subtrees() {
        for start in 0..40u64 {
            for stop in start..80 {
                let mut pos = start;
                for (level, index) in cover(start, stop) {
                    assert_eq!(index << level, pos);
                    pos += 1 << level;
                }
                assert_eq!(pos, stop);
            }
        }
    }

    #[test]
    fn inclusion_proofs_from_spans_verify_and_fail_at_another_index() {
        for n in 1..40u64 {
            let ls = some_leaves(n as usize);
            let levels = subtree_levels(&ls);
            let root = mth(&ls);
            for i in 0..n {
                let proof = spans_root(&levels, &inclusion_spans(i, n));
                assert_eq!(
                    root_from_inclusion(&ls[i as usize], i, n, &proof),
                    Some(root),
                    "{i} of {n}"
                );
                if n > 1 {
                    let j = (i + 1) % n;
                    assert_ne!(root_from_inclusion(&ls[i as usize], j, n, &proof), Some(root));
                }
            }
        }
    }

    #[test]
    fn consistency_proofs_from_spans_verify_and_fail_when_tampered() {
        for n in 1..40u64 {
            let ls = some_leaves(n as usize);
            let levels = subtree_levels(&ls);
            for m in 0..=n {
                let (old, new) = (mth(&ls[..m as usize]), mth(&ls));
                let proof = spans_root(&levels, &consistency_spans(m, n));
                assert!(verify_consistency(m, n, &old, &new, &proof), "{m} to {n}");
                for k in 0..proof.len() {
                    let mut bad = proof.clone();
                    bad[k][0] ^= 1;
                    assert!(!verify_consistency(m, n, &old, &new, &bad));
                }
            }
        }
    }

    #[test]
    fn span_root_of_leaves_is_the_fold_of_its_cover() {
        let ls = some_leaves(45);
        for stop in 0..45u64 {
            for start in 0..=stop {
                let want = fold(
                    &cover(start, stop)
                        .into_iter()
                        .map(|(lv, i)| mth(&ls[(i << lv) as usize..((i + 1) << lv) as usize]))
                        .collect::<Vec<_>>(),
                );
                assert_eq!(span_root_of_leaves(&ls, start, stop, 0), want);
                assert_eq!(span_root_of_leaves(&ls[start as usize..], start, stop, start), want);
            }
        }
    }

    #[test]
    fn extend_by_chunks_reaches_the_frontier_and_subtrees_of_one_leaf_at_a_time() {
        let ls = some_leaves(PAR_NODES * 2 + 77);
        let (mut one, mut made_one) = (Vec::new(), Vec::new());
        for (n, l) in ls.iter().enumerate() {
            made_one.extend(extend(&mut one, n as u64, std::slice::from_ref(l), 1));
        }
        for cuts in [vec![0, 1, 2, 3, 100, 101], vec![0, 5, PAR_NODES * 2 + 10]] {
            let (mut chunked, mut made) = (Vec::new(), Vec::new());
            let mut bounds = cuts.clone();
            bounds.push(ls.len());
            for w in bounds.windows(2) {
                made.extend(extend(&mut chunked, w[0] as u64, &ls[w[0]..w[1]], 1));
            }
            assert_eq!(chunked, one);
            made.sort();
            let mut want = made_one.clone();
            want.sort();
            assert_eq!(made, want);
        }
        let size = ls.len() as u64;
        let want: Vec<Hash> = cover(0, size)
            .into_iter()
            .map(|(lv, i)| mth(&ls[(i << lv) as usize..((i + 1) << lv) as usize]))
            .collect();
        assert_eq!(one, want);
        assert_eq!(fold(&one), mth(&ls));
    }
}
