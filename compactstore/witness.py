"""A witness: each session's latest acknowledged tree head, held outside the store.

A store restored to an older copy of itself, truncated or forked still verifies on
its own: every head, seal and proof in it is one it wrote. A head kept elsewhere
catches it: the store's tree must extend every head the witness holds, which a
consistency proof (RFC 9162) from the held head to the stored one shows in O(log n).

:class:`FileWitness` keeps the heads in one JSON file that several processes may
share: every save is a read-merge-write under an exclusive ``flock`` on a lock file
beside it, written to a temporary file, fsynced and renamed over the old one, so a
reader sees the old heads or the new ones, never a torn file. A merge only ever moves
a session's head forward, and only to a head its tree extends.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

from . import merkle
from .errors import IntegrityError, InvalidArgument, WitnessMismatch, shown
from .events import TreeHead

#: The hash of every tree a witness holds heads of.
HASH = "blake3"


class Held(msgspec.Struct, frozen=True):
    """What a witness holds: the identity of the store it watches and each session's latest head."""

    #: the store's identity (``Store.store_id``); None until the first head is saved
    store_id: str | None = None
    heads: dict[str, TreeHead] = msgspec.field(default_factory=dict)


@runtime_checkable
class Witness(Protocol):
    """Where the heads are held: read them all, or change them in one atomic step."""

    def load(self) -> Held:
        """Return what is held now (an empty :class:`Held` when nothing is)."""
        ...

    def save(self, merge: Callable[[Held], Held]) -> None:
        """Replace what is held by ``merge(held)``, atomically with respect to every other saver."""
        ...


#: Proves a session's tree at one size a prefix of it at another: ``prove(old_size, new_size)``.
Prove = Callable[[int, int], Sequence[bytes]]


def extends(old: TreeHead, size: int, root: bytes, prove: Prove) -> bool:
    """Return whether the tree of ``size`` and ``root`` extends ``old`` (equal, or a proven prefix).

    Requires ``old.size <= size``; ``prove`` serves the consistency proof from ``old.size``.
    """
    if old.size == size:
        return old.root == root
    if old.size == 0:
        return True
    return merkle.verify_consistency(old.size, size, old.root, root, list(prove(old.size, size)), HASH)


def check(held: TreeHead, size: int, root: bytes, prove: Prove) -> None:
    """Refuse a session whose latest stored head (``size``, ``root``) does not extend the ``held`` one.

    Raises:
        WitnessMismatch: the store is behind the witness (restored to an older copy,
            truncated, or the session deleted), or its tree is not an extension of the
            held head (forked, or rewritten).
    """
    if size < held.size:
        raise WitnessMismatch("the store is behind its witness (restored, truncated or deleted)",
                              session=held.session, held=held.size, got=size)
    if not extends(held, size, root, prove):
        raise WitnessMismatch("the stored tree does not extend the witnessed head (forked or rewritten)",
                              session=held.session, held=held.size, got=size)


def advance(held: Held, store_id: str, head: TreeHead, prove: Prove) -> Held:
    """Return ``held`` with ``head`` merged in: the larger head of its session wins, only if it extends the other.

    ``prove(old_size, new_size)`` proves the store's own tree between two sizes, so a
    head another writer saved first, further on, is kept when the store's tree holds it.

    Raises:
        IntegrityError: the witness watches another store.
        WitnessMismatch: the two heads are not of one tree.
    """
    if held.store_id not in (None, store_id):
        raise IntegrityError(f"the witness holds the heads of store {held.store_id}, not of {store_id}",
                             session=head.session)
    old = held.heads.get(head.session)
    if old is not None and old.size > head.size:
        # Another writer saved a later head first: ours must be a prefix of it.
        if not extends(head, old.size, old.root, prove):
            raise WitnessMismatch("the witnessed head does not extend the one just committed (forked)",
                                  session=head.session, held=old.size, got=head.size)
        return held if held.store_id == store_id else msgspec.structs.replace(held, store_id=store_id)
    if old is not None:
        check(old, head.size, head.root, prove)
    heads = dict(held.heads)
    heads[head.session] = head
    return Held(store_id, heads)


_held = msgspec.json.Decoder(Held)
_encode = msgspec.json.Encoder().encode


class FileWitness:
    """A witness kept in a JSON file, shared safely by every process that opens it.

    The lock is taken on ``<path>.lock`` (the data file itself is replaced by each
    save, so a lock on it would not hold across a rename).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Hold heads in the file at ``path`` (created by the first save; its directory must exist)."""
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path) or "\x00" in os.fspath(path):
            raise InvalidArgument("witness", f"want a file path, got {shown(path)}")
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    def __repr__(self) -> str:
        return f"FileWitness({str(self.path)!r})"

    @contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _read(self) -> Held:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return Held()
        try:
            return _held.decode(data)
        except msgspec.DecodeError as exc:
            raise IntegrityError(f"witness file {str(self.path)!r} is not a witness: {exc}") from None

    def load(self) -> Held:
        """Return the heads held in the file (none when it does not exist yet).

        Raises:
            IntegrityError: the file is not a witness file.
        """
        with self._locked(fcntl.LOCK_SH):
            return self._read()

    def save(self, merge: Callable[[Held], Held]) -> None:
        """Write ``merge(held)`` in place of the file's heads, under an exclusive lock, atomically and durably."""
        with self._locked(fcntl.LOCK_EX):
            held = self._read()
            new = merge(held)
            if new == held:
                return
            directory = self.path.parent
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_encode(new))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
            # The rename is durable only once the directory is.
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def as_witness(value: object) -> Witness:
    """Return the witness ``value`` names: a :class:`Witness` as is, a path as a :class:`FileWitness`.

    Raises:
        InvalidArgument: ``value`` is neither.
    """
    if isinstance(value, (str, os.PathLike)):
        return FileWitness(value)
    if isinstance(value, Witness):
        return value
    raise InvalidArgument("witness", f"want a file path or an object with load() and save(merge), got {type(value).__name__}")


class Watch:
    """A store's view of its witness: the heads it checks sessions against, and the saves after each commit.

    The store supplies, per session: its latest stored head (size and root), the
    consistency proofs of its tree, and the MAC of a head (None when unkeyed).
    """

    def __init__(
        self,
        witness: Witness,
        store_id: str,
        latest: Callable[[str], tuple[int, bytes]],
        prove: Callable[[str, int, int], Sequence[bytes]],
        mac: Callable[[str, int, bytes], bytes | None],
    ) -> None:
        self.witness = witness
        self.store_id = store_id
        self._latest = latest
        self._prove = prove
        self._mac = mac
        #: the latest head each session is known to have reached, from the witness or our own commits
        self.held: dict[str, TreeHead] = {}
        #: per session, the held head and the stored (size, root) last shown to extend it: checked once
        self._shown: dict[str, tuple[TreeHead, int, bytes]] = {}

    def load(self) -> list[tuple[str, str]]:
        """Read the witness and check every session it holds; return ``(session, why)`` for each that fails.

        Raises:
            IntegrityError: the witness watches another store.
        """
        held = self.witness.load()
        if held.store_id not in (None, self.store_id):
            raise IntegrityError(f"the witness holds the heads of store {held.store_id}, not of {self.store_id}")
        self.held = dict(held.heads)
        problems = []
        for name in sorted(self.held):
            try:
                self.check(name)
            except IntegrityError as exc:
                problems.append((name, str(exc)))
        return problems

    def check(self, name: str) -> None:
        """Refuse session ``name`` unless its latest stored head extends the head held for it.

        Raises:
            WitnessMismatch: it does not.
            IntegrityError: the held head carries a MAC other than this store's.
        """
        held = self.held.get(name)
        if held is None:
            return
        size, root = self._latest(name)
        if self._shown.get(name) == (held, size, root):
            return
        if held.mac is not None:
            mac = self._mac(name, held.size, held.root)
            if mac is not None and mac != held.mac:
                raise IntegrityError(f"the witness's head of size {held.size} does not carry this store's MAC", session=name)
        check(held, size, root, lambda a, b: self._prove(name, a, b))
        self._shown[name] = (held, size, root)

    def acknowledge(self, name: str, size: int, root: bytes) -> None:
        """Save the head of ``size`` and ``root`` a commit to ``name`` just made, merged into what the witness holds.

        Raises:
            WitnessMismatch, IntegrityError: as :func:`advance`.
        """
        head = TreeHead(name, size, root, self._mac(name, size, root))
        latest: list[TreeHead] = []

        def merge(held: Held) -> Held:
            new = advance(held, self.store_id, head, lambda a, b: self._prove(name, a, b))
            latest.append(new.heads[name])
            return new

        self.witness.save(merge)
        if latest and (name not in self.held or latest[-1].size >= self.held[name].size):
            self.held[name] = latest[-1]
