"""``compactstore proof``: inclusion and consistency proofs as JSON, and their offline check."""

from __future__ import annotations

import hmac
import json
from typing import Any, Literal

import click
import msgspec

from .. import events as ev
from .. import merkle, seal
from ..errors import IntegrityError, InvalidEvent
from .app import (
    EXIT_REFUSED,
    EXIT_USAGE,
    Failure,
    emit,
    json_option,
    key_option,
    main,
    opened,
    pick_session,
    read_key,
    reporting,
    store_options,
)


class InclusionProof(msgspec.Struct, frozen=True, tag="inclusion", tag_field="proof", forbid_unknown_fields=True):
    """The proof that the event at ``pos`` (its canonical JSON ``entry``, its ``leaf``) is in a tree."""

    algo: Literal["blake3", "sha256"]
    session: str
    size: int
    root: str
    pos: int
    leaf: str
    path: list[str]
    entry: str | None = None
    mac: str | None = None


class ConsistencyProof(msgspec.Struct, frozen=True, tag="consistency", tag_field="proof", forbid_unknown_fields=True):
    """The proof that the tree ``(old_size, old_root)`` is a prefix of ``(new_size, new_root)``."""

    algo: Literal["blake3", "sha256"]
    session: str
    old_size: int
    old_root: str
    new_size: int
    new_root: str
    path: list[str]
    mac: str | None = None


Proof = InclusionProof | ConsistencyProof


def _print(doc: Proof, output: str) -> None:
    text = json.dumps(msgspec.to_builtins(doc), indent=2)
    with click.open_file(output, "w") as out:
        out.write(text + "\n")


@main.group("proof")
def proof_group() -> None:
    """Print inclusion and consistency proofs as JSON, and check them offline.

    `proof inclusion` and `proof consistency` read the store; `proof check` needs
    nothing but the proof (RFC 9162 verification, compactstore.merkle).
    """


@proof_group.command("inclusion")
@click.argument("pos", type=int)
@click.option("--size", type=int, help="The tree size to prove against. Default: the session's size now.")
@click.option("--output", "-o", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write the proof to this file instead of stdout.")
@store_options
def inclusion_command(pos: int, size: int | None, output: str, target: str, key_env: str | None,
                      session_name: str | None, as_json: bool) -> None:
    """Print the proof that the event at POS is in the session's tree (always JSON).

    The proof names the tree head (size and root) and carries the event's canonical
    JSON, so `compactstore proof check` can verify it without the store.
    """
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        with reporting(as_json):
            # Only what the store vouches for is proven: the head as the sealed head
            # vouches for it, the event's body against its leaf, and the proof itself
            # against the head, so a proof written out always passes `proof check`.
            head = session.sealed_head(size)
            record = session.view.proven(pos)
            path = session.inclusion_proof(pos, head.size)
            if merkle.root_from_inclusion(record.leaf, pos, head.size, path, "blake3") != head.root:
                raise IntegrityError(f"the stored tree gives no proof of pos {pos} in the head at size {head.size}",
                                     session=session.name, pos=pos)
    doc = InclusionProof(
        "blake3", session.name, head.size, head.root.hex(), pos, record.leaf.hex(), [h.hex() for h in path],
        record.body.decode() if record.body else None, head.mac.hex() if head.mac else None,
    )
    _print(doc, output)


@proof_group.command("consistency")
@click.argument("old_size", type=int)
@click.argument("new_size", type=int, required=False)
@click.option("--output", "-o", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write the proof to this file instead of stdout.")
@store_options
def consistency_command(old_size: int, new_size: int | None, output: str, target: str, key_env: str | None,
                        session_name: str | None, as_json: bool) -> None:
    """Print the proof that the tree at OLD_SIZE is a prefix of the tree at NEW_SIZE (default: now).

    Always JSON, with both tree heads: `compactstore proof check` verifies it offline.
    """
    with opened(target, key_env, as_json) as store:
        session = pick_session(store, session_name, target, as_json)
        with reporting(as_json):
            new = session.sealed_head(new_size)
            path = session.consistency_proof(old_size, new.size)
            old = session.sealed_head(old_size)
            if not merkle.verify_consistency(old.size, new.size, old.root, new.root, path, "blake3"):
                raise IntegrityError(f"the stored tree gives no proof that size {old.size} is a prefix of size {new.size}",
                                     session=session.name, pos=old.size)
    doc = ConsistencyProof(
        "blake3", session.name, old.size, old.root.hex(), new.size, new.root.hex(), [h.hex() for h in path],
        new.mac.hex() if new.mac else None,
    )
    _print(doc, output)


def _unhex(value: str, name: str, as_json: bool) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise Failure(f"proof file: {name} is not hex: {value[:20]!r}", EXIT_USAGE, as_json=as_json) from None


def check(doc: Proof, trusted_root: bytes | None = None, key: str | None = None) -> tuple[bool, str]:
    """Return whether ``doc`` verifies (and proves against ``trusted_root`` when given), and why.

    The hashes bind positions, sizes and roots; nothing in them names a session, and
    anyone can relabel a proof. So the session the proof names is reported as the
    proof's own word, unless ``key`` (the store's key) is given: then the head MAC,
    which binds the session's name to the size and root, must verify, and the name is
    reported as bound.
    """
    root_hex = doc.root if isinstance(doc, InclusionProof) else doc.new_root
    size = doc.size if isinstance(doc, InclusionProof) else doc.new_size
    path = [bytes.fromhex(h) for h in doc.path]
    if isinstance(doc, InclusionProof):
        leaf = bytes.fromhex(doc.leaf)
        if doc.entry is not None and merkle.leaf_hash(doc.entry.encode(), doc.algo) != leaf:
            return False, f"the entry at pos {doc.pos} does not hash to the leaf {doc.leaf[:16]}…"
        ok = merkle.verify_inclusion_hash(leaf, doc.pos, doc.size, path, bytes.fromhex(doc.root), doc.algo)
        where = f"pos {doc.pos} is in {{}} at size {doc.size}, root {doc.root[:16]}…"
    else:
        ok = merkle.verify_consistency(doc.old_size, doc.new_size, bytes.fromhex(doc.old_root),
                                       bytes.fromhex(doc.new_root), path, doc.algo)
        where = (f"{{}} at size {doc.old_size} (root {doc.old_root[:16]}…) is a prefix of size "
                 f"{doc.new_size} (root {doc.new_root[:16]}…)")
    if not ok:
        return False, f"the proof does not verify: it does not show that {where.format('the tree')}"
    if trusted_root is not None and trusted_root.hex() != root_hex:
        return False, f"the proof verifies, but against root {root_hex[:16]}…, not the trusted {trusted_root.hex()[:16]}…"
    trusted = " (the trusted root)" if trusted_root is not None else ""
    if key is None:
        return True, (where.format("the tree") + trusted
                      + f"; session {doc.session!r} is the proof's word (--key-env checks it by the head MAC)")
    if doc.mac is None:
        return False, f"the proof carries no head MAC: nothing binds it to session {doc.session!r}"
    try:
        want = seal.head_mac(seal.derive_key(key), doc.session, size, bytes.fromhex(root_hex))
    except UnicodeEncodeError:
        return False, f"the proof names no session a store could hold: {doc.session!r}"
    if not hmac.compare_digest(want, bytes.fromhex(doc.mac)):
        return False, (f"the head MAC does not verify under this key: the tree at size {size} is not a head of "
                       f"session {doc.session!r} (relabelled, or another store's)")
    return True, where.format(repr(doc.session)) + trusted + " (its head MAC verifies)"


@proof_group.command("check")
@click.argument("file", type=click.File("rb"), default="-")
@click.option("--root", "trusted", metavar="HEX",
              help="Also require the proof to end at this root (a tree head you saved or were given).")
@key_option
@json_option
def check_command(file: Any, trusted: str | None, key_env: str | None, as_json: bool) -> None:
    """Verify a proof from FILE (or stdin) offline: no store is opened.

    Exit status 0 when it verifies, 1 when it does not, 2 when FILE is no proof. A
    proof carries the root it proves against, so it only says something about a store
    when that root is one you trust: pass it with --root. Nothing in the hashes names
    a session: the session is reported as the proof's own word, unless --key-env gives
    the store's key, with which the head MAC binding the session's name must verify.
    """
    raw = file.read()
    try:
        doc: Proof = msgspec.json.decode(raw, type=Proof)
        ev.check_unique_keys(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Failure(f"proof file: {exc}", EXIT_USAGE, as_json=as_json) from exc
    except InvalidEvent as exc:
        raise Failure(f"proof file: {exc}", EXIT_USAGE, as_json=as_json) from exc
    hashes = [doc.root, doc.leaf] if isinstance(doc, InclusionProof) else [doc.old_root, doc.new_root]
    hashes += [] if doc.mac is None else [doc.mac]
    for i, h in enumerate([*hashes, *doc.path]):
        _unhex(h, "path" if i >= len(hashes) else "a root, leaf or MAC", as_json)
    ok, why = check(doc, _unhex(trusted, "--root", as_json) if trusted else None, read_key(key_env))
    if not ok:
        raise Failure(why, EXIT_REFUSED, error="ProofInvalid", as_json=as_json)
    emit(as_json, {"ok": True, "proof": "inclusion" if isinstance(doc, InclusionProof) else "consistency",
                   "session": doc.session if key_env is not None else None, "message": why}, f"ok: {why}")
