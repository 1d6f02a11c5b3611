//! The canonical JSON of plain events (`compactstore.events`), byte for byte what msgspec's
//! `Encoder(order="sorted")` writes, for the events whose every field already holds exactly
//! what decoding would give.
//!
//! `compactstore.events` passes a plan per event type: the fields in the order msgspec
//! writes them (sorted by name, the kind tag among them), with each field's check and
//! default. `Encoder.encode` gives the bytes of each event, or None for one it does not
//! take: a value of any other type (a float, a tuple, a str subclass), a literal outside
//! its values, an empty required text, a value equal to its default object without being
//! it, nesting deeper than the limit, a lone surrogate, a body over the size limit. For
//! those the caller takes msgspec's path, which encodes or refuses them; None is never a
//! refusal of its own, so declining more than needed costs time and never bytes.
//!
//! It reads an event only through msgspec's and Python's public API (`msgspec.structs.astuple`,
//! exact-type checks, `str` as UTF-8), never an interpreter's memory layout. It exists for the
//! batched `extend` goal of `benchmarks/append.py`: the reference path checks each field in
//! Python before msgspec encodes (`benchmarks/native.py` times both), and every test of the
//! encoder compares its bytes with that path's.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyList, PyString, PyTuple, PyType};

/// The deepest JSON an encoder takes (the store's own limit is 64): each level is a native
/// stack frame, and a thread's stack may be small.
const MAX_DEPTH: usize = 256;

// The checks of `compactstore.events._field_check`, by the same numbers.
const STR: u8 = 0;
const INT: u8 = 1;
const BOOL: u8 = 2;
const LITERAL: u8 = 3;
const STR_LIST: u8 = 4;
const INT_LIST: u8 = 5;
const JSON_DICT: u8 = 6;
const JSON: u8 = 7;

/// When a field is left out: msgspec's `omit_defaults` (0: never, the field has no default).
const OMIT_NONE: u8 = 1; // the default is None
const OMIT_OBJECT: u8 = 2; // the default is this object (left out only when the value is it)
const OMIT_EMPTY_LIST: u8 = 3; // a `list` factory: left out when empty
const OMIT_EMPTY_DICT: u8 = 4; // a `dict` factory: left out when empty

struct Field {
    /// Where the field's value lies in `msgspec.structs.astuple(event)`: the field's place
    /// in its type's `__struct_fields__` (None when it has no such place: never taken).
    index: Option<usize>,
    /// `"name":`, as it is written.
    key: Vec<u8>,
    check: u8,
    nullable: bool,
    /// A literal's values, as UTF-8.
    values: Vec<Vec<u8>>,
    omit: u8,
    default: Option<Py<PyAny>>,
    /// The text (or list) may not be empty.
    nonempty: bool,
    /// The int may not be negative.
    nonneg: bool,
    /// The field the clock stamps (`ts`): its value is the clock's reading, and the event's
    /// own must be None.
    stamped: bool,
    /// The field must be None (an idempotency key is the caller's to pass apart).
    absent: bool,
}

enum Part {
    /// Written as it is: the kind tag, `"kind":"turn"`.
    Text(Vec<u8>),
    Field(Field),
}

struct Plan {
    cls: Py<PyType>,
    parts: Vec<Part>,
}

/// The canonical encoder of plain events; see the module's documentation.
#[pyclass(frozen, module = "compactstore.native")]
pub struct Encoder {
    plans: Vec<Plan>,
    /// `msgspec.structs.astuple`: an event's field values in one call, as msgspec reads them.
    astuple: Py<PyAny>,
    /// Bodies longer than this are declined (the caller refuses them in its own words).
    limit: usize,
    /// JSON nested deeper than this is declined.
    depth: usize,
}

/// What `Encoder.encode` returns: the bodies, stamps and events read, and where it stopped.
type Encoded<'py> = (Bound<'py, PyList>, Bound<'py, PyList>, Bound<'py, PyList>, usize);

/// Why an event is not encoded here; the caller's path decides what it is.
struct Decline;

type Out = Result<(), Decline>;

fn field_of(fields: Option<&Bound<'_, PyTuple>>, part: &Bound<'_, PyAny>) -> PyResult<Part> {
    if let Ok(text) = part.cast::<PyBytes>() {
        return Ok(Part::Text(text.as_bytes().to_vec()));
    }
    let t = part.cast::<PyTuple>()?;
    if t.len() != 11 {
        return Err(PyValueError::new_err("a field's plan has 11 items"));
    }
    let values: Vec<String> = t.get_item(4)?.extract()?;
    let default = t.get_item(6)?;
    let name = t.get_item(0)?.cast_into::<PyString>()?;
    let index = fields.and_then(|fields| fields.iter().position(|f| f.eq(&name).unwrap_or(false)));
    let field = Field {
        index,
        key: t.get_item(1)?.cast::<PyBytes>()?.as_bytes().to_vec(),
        check: t.get_item(2)?.extract()?,
        nullable: t.get_item(3)?.extract()?,
        values: values.into_iter().map(String::into_bytes).collect(),
        omit: t.get_item(5)?.extract()?,
        default: (!default.is_none()).then(|| default.unbind()),
        nonempty: t.get_item(7)?.extract()?,
        nonneg: t.get_item(8)?.extract()?,
        stamped: t.get_item(9)?.extract()?,
        absent: t.get_item(10)?.extract()?,
    };
    if field.check > JSON || field.omit > OMIT_EMPTY_DICT || (field.omit == OMIT_OBJECT) != field.default.is_some() {
        return Err(PyValueError::new_err(
            "a field's plan names an unknown check or default",
        ));
    }
    Ok(Part::Field(field))
}

#[pymethods]
impl Encoder {
    /// `plans`: `(type, parts)` per event type, each part the kind tag's bytes or a field's
    /// `(name, key bytes, check, nullable, literal values, omit, default, nonempty, nonneg, stamped, absent)`.
    #[new]
    fn new(plans: &Bound<'_, PyList>, limit: usize, depth: usize) -> PyResult<Self> {
        // Each level of a JSON value is a frame of native stack: bound it.
        if depth > MAX_DEPTH {
            return Err(PyValueError::new_err(format!(
                "depth must be at most {MAX_DEPTH}, got {depth}"
            )));
        }
        let mut out = Vec::with_capacity(plans.len());
        for plan in plans.iter() {
            let (cls, parts): (Bound<'_, PyType>, Bound<'_, PyList>) = plan.extract()?;
            // A type that is no msgspec Struct has no fields to read: its events are never taken.
            let fields = cls
                .getattr("__struct_fields__")
                .ok()
                .and_then(|f| f.cast_into_exact::<PyTuple>().ok());
            let parts = parts
                .iter()
                .map(|p| field_of(fields.as_ref(), &p))
                .collect::<PyResult<Vec<_>>>()?;
            out.push(Plan {
                cls: cls.unbind(),
                parts,
            });
        }
        Ok(Encoder {
            plans: out,
            astuple: plans.py().import("msgspec.structs")?.getattr("astuple")?.unbind(),
            limit,
            depth,
        })
    }

    /// Stamp and encode `events[start:]` in order until one is not taken: return the bytes
    /// of those taken, the stamps read and the events read (the last of each is the one
    /// not taken's, when one is not), and the index of the one not taken (`len(events)`
    /// when all are).
    ///
    /// Each event's stamp is `clock() // scale`, read just before the event is taken from
    /// the list (the clock is Python code, and may change the list), and is what its body
    /// holds for `ts`. An error of the clock is raised as it is.
    fn encode<'py>(
        &self,
        py: Python<'py>,
        events: &Bound<'py, PyAny>,
        start: usize,
        clock: &Bound<'py, PyAny>,
        scale: &Bound<'py, PyAny>,
    ) -> PyResult<Encoded<'py>> {
        // An exact list only: a subclass's own methods would not be the ones read here.
        let events = events
            .cast_exact::<PyList>()
            .map_err(|_| PyTypeError::new_err("events must be a list"))?;
        if scale.lt(1)? {
            return Err(PyValueError::new_err(format!("scale must be at least 1, got {scale}")));
        }
        // As Python reads `clock() // scale`: in i64 for exact ints, else by Python's `//`.
        let one = scale.eq(1)?;
        let fast = if scale.is_exact_instance_of::<PyInt>() {
            scale.extract::<i64>().ok()
        } else {
            None
        };
        let mut buf = Vec::with_capacity(4096);
        let (bodies, stamps, read) = (PyList::empty(py), PyList::empty(py), PyList::empty(py));
        let mut i = start;
        while i < events.len() {
            let mut stamp = clock.call0()?;
            if !one {
                let exact = if stamp.is_exact_instance_of::<PyInt>() {
                    stamp.extract::<i64>().ok()
                } else {
                    None
                };
                stamp = match (exact, fast) {
                    (Some(n), Some(d)) => n.div_euclid(d).into_pyobject(py)?.into_any(),
                    _ => stamp.floor_div(scale)?,
                };
            }
            stamps.append(&stamp)?;
            let event = events.get_item(i)?;
            read.append(&event)?;
            buf.clear();
            let taken = match self.plan_of(&event) {
                Some(plan) => self.event(&mut buf, plan, &event, &stamp).is_ok() && buf.len() <= self.limit,
                None => false,
            };
            if !taken {
                return Ok((bodies, stamps, read, i));
            }
            bodies.append(PyBytes::new(py, &buf))?;
            i += 1;
        }
        Ok((bodies, stamps, read, i))
    }
}

impl Encoder {
    fn plan_of(&self, event: &Bound<'_, PyAny>) -> Option<&Plan> {
        let cls = event.get_type();
        self.plans.iter().find(|p| cls.is(p.cls.bind(event.py())))
    }

    fn event(&self, buf: &mut Vec<u8>, plan: &Plan, event: &Bound<'_, PyAny>, stamp: &Bound<'_, PyAny>) -> Out {
        let values = self.astuple.bind(event.py()).call1((event,)).map_err(|_| Decline)?;
        let values = values.cast_exact::<PyTuple>().map_err(|_| Decline)?;
        buf.push(b'{');
        let mut first = true;
        for part in &plan.parts {
            let start = buf.len();
            if !first {
                buf.push(b',');
            }
            let wrote = match part {
                Part::Text(text) => {
                    buf.extend_from_slice(text);
                    true
                }
                Part::Field(f) => self.field(buf, f, values, stamp)?,
            };
            if wrote {
                first = false;
            } else {
                buf.truncate(start);
            }
        }
        buf.push(b'}');
        Ok(())
    }

    /// Write `"name":value`, or nothing when msgspec leaves the field out; false when left out.
    fn field(
        &self,
        buf: &mut Vec<u8>,
        f: &Field,
        values: &Bound<'_, PyTuple>,
        stamp: &Bound<'_, PyAny>,
    ) -> Result<bool, Decline> {
        let own = values.get_item(f.index.ok_or(Decline)?).map_err(|_| Decline)?;
        if (f.stamped || f.absent) && !own.is_none() {
            return Err(Decline); // a stamp or a key of the caller's own: not this path's to write
        }
        let v = if f.stamped { stamp.clone() } else { own };
        match f.omit {
            OMIT_NONE if v.is_none() => return Ok(false),
            OMIT_OBJECT => {
                let d = f.default.as_ref().ok_or(Decline)?.bind(values.py());
                if v.is(d) {
                    return Ok(false);
                }
                // Equal without being it: msgspec would write it, and the decoded event
                // would not. Not plain; the caller's path writes the canonical bytes.
                if v.get_type().is(d.get_type()) && v.eq(d).map_err(|_| Decline)? {
                    return Err(Decline);
                }
            }
            OMIT_EMPTY_LIST if v.is_exact_instance_of::<PyList>() && v.len().map_err(|_| Decline)? == 0 => {
                return Ok(false)
            }
            OMIT_EMPTY_DICT if v.is_exact_instance_of::<PyDict>() && v.len().map_err(|_| Decline)? == 0 => {
                return Ok(false)
            }
            _ => {}
        }
        buf.extend_from_slice(&f.key);
        if v.is_none() {
            if !f.nullable || f.nonempty {
                return Err(Decline);
            }
            buf.extend_from_slice(b"null");
            return Ok(true);
        }
        match f.check {
            STR => {
                let s = text(&v)?;
                if f.nonempty && s.is_empty() {
                    return Err(Decline);
                }
                write_str(buf, s);
            }
            LITERAL => {
                let s = text(&v)?;
                if !f.values.iter().any(|x| x.as_slice() == s) || (f.nonempty && s.is_empty()) {
                    return Err(Decline);
                }
                write_str(buf, s);
            }
            INT => {
                let n = int(&v)?;
                if f.nonneg && n.negative() {
                    return Err(Decline);
                }
                n.write(buf);
            }
            BOOL => write_bool(buf, &v)?,
            STR_LIST | INT_LIST => {
                let items = v.cast_exact::<PyList>().map_err(|_| Decline)?;
                if f.nonempty && items.is_empty() {
                    return Err(Decline);
                }
                write_list(buf, items, |buf, item| {
                    if f.check == STR_LIST {
                        write_str(buf, text(item)?);
                    } else {
                        int(item)?.write(buf);
                    }
                    Ok(())
                })?;
            }
            JSON_DICT if !v.is_exact_instance_of::<PyDict>() => return Err(Decline),
            JSON_DICT | JSON => {
                if f.nonempty {
                    return Err(Decline);
                }
                self.json(buf, &v, 0)?;
            }
            _ => return Err(Decline),
        }
        Ok(true)
    }

    /// Write a JSON value of exactly the types decoding gives: str, int, bool, None, list, dict.
    fn json(&self, buf: &mut Vec<u8>, v: &Bound<'_, PyAny>, depth: usize) -> Out {
        if depth > self.depth {
            return Err(Decline);
        }
        if v.is_none() {
            buf.extend_from_slice(b"null");
        } else if v.is_exact_instance_of::<PyString>() {
            write_str(buf, text(v)?);
        } else if v.is_exact_instance_of::<PyBool>() {
            write_bool(buf, v)?;
        } else if v.is_exact_instance_of::<PyInt>() {
            int(v)?.write(buf);
        } else if let Ok(items) = v.cast_exact::<PyList>() {
            write_list(buf, items, |buf, item| self.json(buf, item, depth + 1))?;
        } else if let Ok(map) = v.cast_exact::<PyDict>() {
            // Sorted by key: code point order, which is the order of their UTF-8 bytes.
            let mut pairs = Vec::with_capacity(map.len());
            for (k, value) in map.iter() {
                if !k.is_exact_instance_of::<PyString>() {
                    return Err(Decline);
                }
                pairs.push((k, value));
            }
            let mut keyed = Vec::with_capacity(pairs.len());
            for (k, value) in &pairs {
                keyed.push((text(k)?, value));
            }
            keyed.sort_unstable_by(|a, b| a.0.cmp(b.0));
            buf.push(b'{');
            for (i, (k, value)) in keyed.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                write_str(buf, k);
                buf.push(b':');
                self.json(buf, value, depth + 1)?;
            }
            buf.push(b'}');
        } else {
            return Err(Decline); // a float, a tuple, a subclass: msgspec's path
        }
        Ok(())
    }
}

/// Write `[a,b,...]`, each item by `item`.
fn write_list(
    buf: &mut Vec<u8>,
    items: &Bound<'_, PyList>,
    mut item: impl FnMut(&mut Vec<u8>, &Bound<'_, PyAny>) -> Out,
) -> Out {
    buf.push(b'[');
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        item(buf, &x)?;
    }
    buf.push(b']');
    Ok(())
}

/// The UTF-8 of an exact `str` (a lone surrogate has none: declined).
fn text<'a>(v: &'a Bound<'_, PyAny>) -> Result<&'a [u8], Decline> {
    let s = v.cast_exact::<PyString>().map_err(|_| Decline)?;
    // The UTF-8 is the str's own (immutable, kept alive by `v`), borrowed for `v`'s lifetime.
    match s.to_str() {
        Ok(s) => Ok(s.as_bytes()),
        Err(_) => Err(Decline),
    }
}

fn write_bool(buf: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> Out {
    let b = v.cast_exact::<PyBool>().map_err(|_| Decline)?;
    buf.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    Ok(())
}

/// An int msgspec reads back as the same int: from -2**63 to 2**64 - 1.
enum Int {
    Signed(i64),
    Unsigned(u64),
}

impl Int {
    fn negative(&self) -> bool {
        matches!(self, Int::Signed(n) if *n < 0)
    }

    fn write(&self, buf: &mut Vec<u8>) {
        match *self {
            Int::Signed(n) if n < 0 => {
                buf.push(b'-');
                write_u64(buf, n.unsigned_abs());
            }
            Int::Signed(n) => write_u64(buf, n as u64),
            Int::Unsigned(n) => write_u64(buf, n),
        }
    }
}

fn int(v: &Bound<'_, PyAny>) -> Result<Int, Decline> {
    if !v.is_exact_instance_of::<PyInt>() {
        return Err(Decline); // a bool, an int subclass
    }
    if let Ok(n) = v.extract::<i64>() {
        return Ok(Int::Signed(n));
    }
    v.extract::<u64>().map(Int::Unsigned).map_err(|_| Decline)
}

/// Append the decimal digits of `n`.
pub fn write_u64(buf: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

/// Append `s` as a JSON string, escaped as msgspec escapes: `\"`, `\\`, `\b`, `\t`, `\n`,
/// `\f`, `\r`, and every other byte below 0x20 as `\u00xx`; everything else as it is.
pub fn write_str(buf: &mut Vec<u8>, s: &[u8]) {
    buf.reserve(s.len() + 2);
    buf.push(b'"');
    let mut rest = s;
    loop {
        let clean = clean_prefix(rest);
        buf.extend_from_slice(&rest[..clean]);
        let Some(&b) = rest.get(clean) else { break };
        match b {
            b'"' => buf.extend_from_slice(b"\\\""),
            b'\\' => buf.extend_from_slice(b"\\\\"),
            0x08 => buf.extend_from_slice(b"\\b"),
            b'\t' => buf.extend_from_slice(b"\\t"),
            b'\n' => buf.extend_from_slice(b"\\n"),
            0x0c => buf.extend_from_slice(b"\\f"),
            b'\r' => buf.extend_from_slice(b"\\r"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                buf.extend_from_slice(b"\\u00");
                buf.push(HEX[(b >> 4) as usize]);
                buf.push(HEX[(b & 15) as usize]);
            }
        }
        rest = &rest[clean + 1..];
    }
    buf.push(b'"');
}

fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The length of the longest prefix of `s` that needs no escaping.
pub fn clean_prefix(s: &[u8]) -> usize {
    // Whole blocks are checked without a branch per byte, which the compiler turns into SIMD
    // compares; the block that holds a byte to escape is searched byte by byte.
    const BLOCK: usize = 64;
    let mut i = 0;
    for block in s.chunks_exact(BLOCK) {
        let hit = block
            .iter()
            .map(|&b| u8::from(b < 0x20) | u8::from(b == b'"') | u8::from(b == b'\\'))
            .fold(0, |seen, b| seen | b);
        if hit != 0 {
            break;
        }
        i += BLOCK;
    }
    i + s[i..].iter().position(|&b| needs_escape(b)).unwrap_or(s.len() - i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_prefix_finds_the_first_byte_to_escape_at_every_offset() {
        for len in 0..70 {
            for at in 0..=len {
                for special in [b'"', b'\\', 0u8, 0x1f, b'\n'] {
                    let mut s = vec![b'a'; len];
                    s.iter_mut().enumerate().for_each(|(i, b)| *b = 0x20 + (i % 95) as u8);
                    s.iter_mut().for_each(|b| {
                        if needs_escape(*b) {
                            *b = b'x'
                        }
                    });
                    if at < len {
                        s[at] = special;
                    }
                    assert_eq!(clean_prefix(&s), at, "len {len} at {at}");
                }
            }
        }
        assert_eq!(clean_prefix("é\u{7f}\u{2028}😀".as_bytes()), "é\u{7f}\u{2028}😀".len());
    }

    #[test]
    fn strings_are_escaped_as_msgspec_escapes_them() {
        let mut buf = Vec::new();
        write_str(&mut buf, b"a\"b\\c\x08\t\n\x0c\r\x00\x1f\x7f");
        assert_eq!(buf, b"\"a\\\"b\\\\c\\b\\t\\n\\f\\r\\u0000\\u001f\x7f\"");
    }

    #[test]
    fn integers_are_written_in_decimal() {
        for (n, text) in [
            (Int::Signed(0), "0"),
            (Int::Signed(-1), "-1"),
            (Int::Signed(i64::MIN), "-9223372036854775808"),
            (Int::Signed(i64::MAX), "9223372036854775807"),
            (Int::Unsigned(u64::MAX), "18446744073709551615"),
        ] {
            let mut buf = Vec::new();
            n.write(&mut buf);
            assert_eq!(buf, text.as_bytes());
        }
    }
}
