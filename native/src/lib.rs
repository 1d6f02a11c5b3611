//! `compactstore.native`: the BLAKE3 Merkle hot paths of `compactstore.merkle`, in Rust.
//! (`json.rs` holds the other hot path, the canonical JSON of plain events for
//! `compactstore.events`.)
//!
//! Each function here has a namesake in `compactstore/merkle_pure.py` that gives the
//! same bytes; `compactstore.merkle` checks arguments and calls these for BLAKE3. Hashes
//! are 32-byte `bytes`; entries are `bytes` (or `bytearray`). The GIL is released while
//! hashing, except for work of a few node hashes, where releasing it would cost more than
//! the hashing.

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyList, PyTuple};

pub mod content;
pub mod hash;
pub mod json;
pub mod par;
pub mod tree;

use hash::Hash;

/// Below this many bytes a single leaf is hashed without releasing the GIL.
const DETACH_BYTES: usize = 4096;
/// Below this many hashes a fold or a frontier step is done without releasing the GIL.
const DETACH_HASHES: usize = 16;

/// Run `work` with the GIL released, unless it is `small`: for a few hashes, releasing
/// the GIL and taking it back costs more than the hashing.
fn detach_unless<T, F>(py: Python<'_>, small: bool, work: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if small {
        work()
    } else {
        py.detach(work)
    }
}

/// The items of an exact list or tuple; anything else is a TypeError naming `field`.
///
/// Native code reads only containers whose length and items are what it sees in C: a
/// subclass or another sequence may define them otherwise (or report a length it does not
/// have), so `compactstore.merkle` hands those to the reference, which reads them as
/// Python does.
fn items_of<'py>(field: &str, obj: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(list) = obj.cast_exact::<PyList>() {
        return Ok(list.iter().collect());
    }
    if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
    Err(PyTypeError::new_err(format!("{field} must be a list or a tuple")))
}

/// Return the hashes of list or tuple `items` (each read as [`hash_arg`] reads it); an
/// exact `bytes` of another length is a ValueError naming it (`compactstore.merkle` then
/// asks the reference).
fn hashes_of(field: &str, items: &Bound<'_, PyAny>) -> PyResult<Vec<Hash>> {
    items_of(field, items)?
        .iter()
        .enumerate()
        .map(|(i, item)| {
            hash_arg(field, item)?.ok_or_else(|| PyValueError::new_err(format!("{field}[{i}] is not a 32-byte hash")))
        })
        .collect()
}

/// Return the hash `obj` is, or None when it is an exact `bytes` of another length. Anything
/// else (a subclass may answer `len` or `==` its own way) is a TypeError naming `field`:
/// the reference judges it.
fn hash_arg(field: &str, obj: &Bound<'_, PyAny>) -> PyResult<Option<Hash>> {
    let b = obj
        .cast_exact::<PyBytes>()
        .map_err(|_| PyTypeError::new_err(format!("{field} must be bytes, not {}", obj.get_type())))?;
    Ok(b.as_bytes().try_into().ok())
}

/// Return the hashes of list or tuple `items`, or None when one is an exact `bytes` of
/// another length (as [`hash_arg`] reads each).
fn well_formed(field: &str, items: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Hash>>> {
    items_of(field, items)?
        .iter()
        .map(|item| hash_arg(field, item))
        .collect()
}

/// One entry as Python passed it: `bytes` held as it is (immutable, so its buffer stays
/// put while the GIL is released), anything else bytes-like through `PyBackedBytes`
/// (a `bytearray` is copied, since Python code may resize it meanwhile).
enum Entry<'py> {
    Bytes(Bound<'py, PyBytes>),
    Other(PyBackedBytes),
}

/// The entries of a list (or any iterable) of `bytes`-like objects.
///
/// Cheaper than extracting a `Vec<PyBackedBytes>`: a list or tuple is read by index, and a
/// `bytes` item is only checked and referenced.
struct Entries<'py>(Vec<Entry<'py>>);

impl<'py> FromPyObject<'_, 'py> for Entries<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        let one = |item: Bound<'py, PyAny>| -> PyResult<Entry<'py>> {
            match item.cast_into::<PyBytes>() {
                Ok(b) => Ok(Entry::Bytes(b)),
                Err(e) => Ok(Entry::Other(e.into_inner().extract()?)),
            }
        };
        Ok(Entries(
            items_of("entries", &obj.to_owned())?
                .into_iter()
                .map(one)
                .collect::<PyResult<_>>()?,
        ))
    }
}

impl Entries<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn slices(&self) -> Vec<&[u8]> {
        self.0
            .iter()
            .map(|e| match e {
                Entry::Bytes(b) => b.as_bytes(),
                Entry::Other(p) => &**p,
            })
            .collect()
    }
}

fn bytes_list<'py>(py: Python<'py>, hashes: &[Hash]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, hashes.iter().map(|h| PyBytes::new(py, h)))
}

/// Return ``H(0x00 || entry)``.
#[pyfunction]
fn leaf_hash<'py>(py: Python<'py>, entry: PyBackedBytes) -> Bound<'py, PyBytes> {
    PyBytes::new(
        py,
        &detach_unless(py, entry.len() < DETACH_BYTES, || hash::leaf(&entry)),
    )
}

/// Return ``H(0x00 || entry)`` of each entry, in order.
#[pyfunction]
fn leaf_hashes<'py>(py: Python<'py>, entries: Entries<'py>) -> PyResult<Bound<'py, PyList>> {
    let slices = entries.slices();
    let out = py.detach(|| tree::leaves(&slices));
    bytes_list(py, &out)
}

/// Return the BLAKE3 hash of ``data``, keyed with the 32-byte ``key`` unless it is None.
#[pyfunction]
#[pyo3(signature = (data, key))]
fn digest<'py>(py: Python<'py>, data: PyBackedBytes, key: Option<PyBackedBytes>) -> PyResult<Bound<'py, PyBytes>> {
    let h = match key {
        None => blake3::hash(&data),
        Some(k) => {
            let k: &[u8; 32] = (&*k)
                .try_into()
                .map_err(|_| PyValueError::new_err("key must be 32 bytes"))?;
            blake3::keyed_hash(k, &data)
        }
    };
    Ok(PyBytes::new(py, h.as_bytes()))
}

/// Return ``H(0x01 || left || right)``.
#[pyfunction]
fn node_hash<'py>(py: Python<'py>, left: PyBackedBytes, right: PyBackedBytes) -> Bound<'py, PyBytes> {
    let h = match (<&Hash>::try_from(&*left), <&Hash>::try_from(&*right)) {
        (Ok(l), Ok(r)) => hash::node(l, r),
        _ => hash::node_of_any(&left, &right),
    };
    PyBytes::new(py, &h)
}

/// Return the RFC 9162 Merkle Tree Hash of ``entries``.
#[pyfunction]
fn tree_root<'py>(py: Python<'py>, entries: Entries<'py>) -> Bound<'py, PyBytes> {
    let slices = entries.slices();
    PyBytes::new(py, &py.detach(|| tree::tree_root(&slices)))
}

/// Return the RFC 9162 root over leaf hashes.
#[pyfunction]
fn root_of_leaves<'py>(py: Python<'py>, leaves: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let leaves = hashes_of("leaves", leaves)?;
    Ok(PyBytes::new(py, &py.detach(|| tree::root_of_leaves(&leaves))))
}

/// Return the roots of every complete aligned subtree over leaf hashes, level by level.
#[pyfunction]
fn subtree_levels<'py>(py: Python<'py>, leaves: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let leaves = hashes_of("leaves", leaves)?;
    let levels = py.detach(|| tree::subtree_levels(&leaves));
    PyList::new(
        py,
        levels
            .iter()
            .map(|level| bytes_list(py, level))
            .collect::<PyResult<Vec<_>>>()?,
    )
}

/// Return the root of ``[start, stop)`` given the entries of exactly those positions.
#[pyfunction]
fn span_root<'py>(py: Python<'py>, entries: Entries<'py>, start: u64, stop: u64) -> PyResult<Bound<'py, PyBytes>> {
    if stop < start || stop - start != entries.len() as u64 {
        return Err(PyValueError::new_err(
            "the entries of [start, stop) are stop - start entries",
        ));
    }
    let slices = entries.slices();
    let root = py.detach(|| tree::span_root_of_leaves(&tree::leaves(&slices), start, stop, start));
    Ok(PyBytes::new(py, &root))
}

/// Return the root of ``[start, stop)`` given the leaf hashes of exactly those positions.
#[pyfunction]
fn span_root_of_leaves<'py>(
    py: Python<'py>,
    leaves: &Bound<'py, PyAny>,
    start: u64,
    stop: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let leaves = hashes_of("leaves", leaves)?;
    if stop < start || stop - start != leaves.len() as u64 {
        return Err(PyValueError::new_err(
            "the leaves of [start, stop) are stop - start hashes",
        ));
    }
    Ok(PyBytes::new(
        py,
        &py.detach(|| tree::span_root_of_leaves(&leaves, start, stop, start)),
    ))
}

/// Return the root of a compact range's hashes, merged right to left.
#[pyfunction]
fn fold<'py>(py: Python<'py>, hashes: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let hashes = hashes_of("hashes", hashes)?;
    let root = detach_unless(py, hashes.len() < DETACH_HASHES, || tree::fold(&hashes));
    Ok(PyBytes::new(py, &root))
}

/// Return the RFC 9162 inclusion proof of ``entries[index]``. Requires ``0 <= index < len(entries)``.
#[pyfunction]
fn inclusion_proof<'py>(py: Python<'py>, entries: Entries<'py>, index: u64) -> PyResult<Bound<'py, PyList>> {
    let size = entries.len() as u64;
    if index >= size {
        return Err(PyValueError::new_err("index must be in [0, len(entries))"));
    }
    let slices = entries.slices();
    let proof = py.detach(|| {
        let levels = tree::subtree_levels(&tree::leaves(&slices));
        tree::spans_root(&levels, &tree::inclusion_spans(index, size))
    });
    bytes_list(py, &proof)
}

/// Return the RFC 9162 consistency proof from the first ``old_size`` entries to all.
#[pyfunction]
fn consistency_proof<'py>(py: Python<'py>, entries: Entries<'py>, old_size: u64) -> PyResult<Bound<'py, PyList>> {
    let size = entries.len() as u64;
    if old_size > size {
        return Err(PyValueError::new_err("old_size must be in [0, len(entries)]"));
    }
    let slices = entries.slices();
    let proof = py.detach(|| {
        let levels = tree::subtree_levels(&tree::leaves(&slices));
        tree::spans_root(&levels, &tree::consistency_spans(old_size, size))
    });
    bytes_list(py, &proof)
}

/// Return the root that ``proof`` implies for leaf hash ``leaf`` at ``index``, or None
/// when it cannot be valid (wrong length, a hash that is not 32 bytes).
#[pyfunction]
fn root_from_inclusion<'py>(
    py: Python<'py>,
    leaf: &Bound<'py, PyAny>,
    index: u64,
    size: u64,
    proof: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let (Some(leaf), Some(proof)) = (hash_arg("leaf", leaf)?, well_formed("proof", proof)?) else {
        return Ok(None);
    };
    let root = py.detach(|| tree::root_from_inclusion(&leaf, index, size, &proof));
    Ok(root.map(|r| PyBytes::new(py, &r)))
}

/// Return whether ``proof`` shows the tree ``(old_size, old_root)`` is a prefix of ``(new_size, new_root)``.
#[pyfunction]
fn verify_consistency(
    py: Python<'_>,
    old_size: u64,
    new_size: u64,
    old_root: &Bound<'_, PyAny>,
    new_root: &Bound<'_, PyAny>,
    proof: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    let (Some(old_root), Some(new_root), Some(proof)) = (
        hash_arg("old_root", old_root)?,
        hash_arg("new_root", new_root)?,
        well_formed("proof", proof)?,
    ) else {
        return Ok(false);
    };
    Ok(py.detach(|| tree::verify_consistency(old_size, new_size, &old_root, &new_root, &proof)))
}

/// Check and read the arguments both frontier calls take: the roots of ``cover(0, size)``
/// and the leaf hashes to add, with ``every`` at least 1.
fn frontier_args(
    size: u64,
    hashes: &Bound<'_, PyAny>,
    leaves: &Bound<'_, PyAny>,
    every: u32,
) -> PyResult<(Vec<Hash>, Vec<Hash>)> {
    if every == 0 {
        return Err(PyValueError::new_err("every must be at least 1"));
    }
    let frontier = hashes_of("hashes", hashes)?;
    if frontier.len() != size.count_ones() as usize {
        return Err(PyValueError::new_err(format!(
            "size {size} needs {} roots, got {}",
            size.count_ones(),
            frontier.len()
        )));
    }
    let leaves = hashes_of("leaves", leaves)?;
    // Sizes are u64: a tree of 2**64 leaves or more is the reference's.
    if size.checked_add(leaves.len() as u64).is_none() {
        return Err(PyValueError::new_err(format!(
            "{} leaves after {size} pass 2**64 - 1",
            leaves.len()
        )));
    }
    Ok((frontier, leaves))
}

/// The completed subtrees ``(level, index, root)`` as a Python list.
fn subtree_list<'py>(py: Python<'py>, made: &[(u32, u64, Hash)]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(
        py,
        made.iter()
            .map(|(level, index, root)| (*level, *index, PyBytes::new(py, root))),
    )
}

/// Add leaf hashes to the frontier ``hashes`` of a tree of ``size`` leaves; return the new
/// frontier and the completed subtrees ``(level, index, root)`` at levels that are multiples of ``every``.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn frontier_extend<'py>(
    py: Python<'py>,
    size: u64,
    hashes: &Bound<'py, PyAny>,
    leaves: &Bound<'py, PyAny>,
    every: u32,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    let (mut frontier, leaves) = frontier_args(size, hashes, leaves, every)?;
    let made = detach_unless(py, leaves.len() < DETACH_HASHES, || {
        tree::extend(&mut frontier, size, &leaves, every)
    });
    Ok((bytes_list(py, &frontier)?, subtree_list(py, &made)?))
}

/// Extend a frontier's hashes, the Python list ``hashes`` (the roots of ``cover(0, size)``),
/// by leaf hashes ``leaves`` in place; return the completed subtrees ``(level, index, root)``
/// at levels that are multiples of ``every`` and the new tree's root.
///
/// ``frontier_extend`` and ``fold`` in one call: the roots the leaves leave unchanged stay
/// the list's own objects, and the root is folded from the hashes at hand. Nothing is
/// changed when an argument is refused.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn frontier_push<'py>(
    py: Python<'py>,
    size: u64,
    hashes: &Bound<'py, PyList>,
    leaves: &Bound<'py, PyAny>,
    every: u32,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyBytes>)> {
    let (before, leaves) = frontier_args(size, hashes.as_any(), leaves, every)?;
    let mut frontier = before.clone();
    let (made, root) = detach_unless(py, leaves.len() < DETACH_HASHES, || {
        let made = tree::extend(&mut frontier, size, &leaves, every);
        (made, tree::fold(&frontier))
    });
    // Extending pops roots off the end and pushes new ones: the prefix both share stays.
    let keep = before.iter().zip(&frontier).take_while(|(a, b)| a == b).count();
    hashes.del_slice(keep, before.len())?;
    for h in &frontier[keep..] {
        hashes.append(PyBytes::new(py, h))?;
    }
    Ok((subtree_list(py, &made)?, PyBytes::new(py, &root)))
}

/// The content digest of a span, fed batch by batch (see `content.rs`).
///
/// Safe to share between threads: each `update` adds its batch whole, under the digest's
/// own lock, taken with the GIL released when the batch is large.
#[pyclass(frozen, module = "compactstore.native")]
struct ContentDigest {
    inner: Mutex<Digesting>,
}

/// The state being fed, or the digest once taken.
enum Digesting {
    Open(Box<content::State>),
    Done(Hash),
}

impl ContentDigest {
    fn lock(&self) -> PyResult<MutexGuard<'_, Digesting>> {
        self.inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("a content digest broke off mid-update: start another"))
    }
}

#[pymethods]
impl ContentDigest {
    #[new]
    fn new(tag: &[u8]) -> Self {
        ContentDigest {
            inner: Mutex::new(Digesting::Open(Box::new(content::State::new(tag)))),
        }
    }

    /// Add the next bodies, in order. A body that is not bytes (None) is a TypeError.
    ///
    /// A list or tuple is read as it is; any other iterable once, into a list, as
    /// `list(bodies)` reads it.
    fn update(&self, py: Python<'_>, bodies: &Bound<'_, PyAny>) -> PyResult<()> {
        let listed;
        let bodies = if bodies.is_exact_instance_of::<PyList>() || bodies.is_exact_instance_of::<PyTuple>() {
            bodies
        } else {
            listed = py.get_type::<PyList>().call1((bodies,))?;
            &listed
        };
        let bodies = items_of("bodies", bodies)?
            .iter()
            .map(|b| b.extract::<PyBackedBytes>().map_err(PyErr::from))
            .collect::<PyResult<Vec<_>>>()?;
        if matches!(*self.lock()?, Digesting::Done(_)) {
            return Err(PyValueError::new_err("the digest was taken: start another"));
        }
        let small = bodies.iter().map(|b| b.len()).sum::<usize>() < DETACH_BYTES;
        detach_unless(py, small, || -> PyResult<()> {
            let mut inner = self.lock()?;
            let Digesting::Open(state) = &mut *inner else {
                return Err(PyValueError::new_err("the digest was taken: start another"));
            };
            for body in &bodies {
                state.add(body);
            }
            state.flush();
            Ok(())
        })
    }

    /// Return the 32-byte digest of everything added (the same on every call).
    fn digest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut inner = self.lock()?;
        let done = match std::mem::replace(&mut *inner, Digesting::Done([0; 32])) {
            Digesting::Open(state) => state.finish(),
            Digesting::Done(h) => h,
        };
        *inner = Digesting::Done(done);
        Ok(PyBytes::new(py, &done))
    }
}

#[pymodule]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(leaf_hash, m)?)?;
    m.add_function(wrap_pyfunction!(leaf_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(node_hash, m)?)?;
    m.add_function(wrap_pyfunction!(digest, m)?)?;
    m.add_function(wrap_pyfunction!(tree_root, m)?)?;
    m.add_function(wrap_pyfunction!(root_of_leaves, m)?)?;
    m.add_function(wrap_pyfunction!(subtree_levels, m)?)?;
    m.add_function(wrap_pyfunction!(span_root, m)?)?;
    m.add_function(wrap_pyfunction!(span_root_of_leaves, m)?)?;
    m.add_function(wrap_pyfunction!(fold, m)?)?;
    m.add_function(wrap_pyfunction!(inclusion_proof, m)?)?;
    m.add_function(wrap_pyfunction!(consistency_proof, m)?)?;
    m.add_function(wrap_pyfunction!(root_from_inclusion, m)?)?;
    m.add_function(wrap_pyfunction!(verify_consistency, m)?)?;
    m.add_function(wrap_pyfunction!(frontier_extend, m)?)?;
    m.add_function(wrap_pyfunction!(frontier_push, m)?)?;
    m.add_class::<ContentDigest>()?;
    m.add_class::<json::Encoder>()?;
    Ok(())
}
