"""The gate every backend call passes: closing waits for calls in flight, then refuses new ones.

A driver connection closed under a call another thread is making crashes the process
(SQLite's C library frees what the running statement still uses); a pool closed under
one leaves that call with a driver error. So a backend counts the calls it is serving,
and :meth:`Gate.close` shuts the gate, waits for the count to reach zero, and only then
lets the backend release its connections.
"""

from __future__ import annotations

import threading

from ..errors import StoreClosed


class Gate:
    """A closing flag and a count of calls in flight, under one condition variable."""

    __slots__ = ("_cond", "_active", "_closed", "_where", "_depth")

    def __init__(self, where: str) -> None:
        """Open the gate of the store at ``where`` (named in the error a closed gate raises)."""
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._closed = False
        self._where = where
        # Calls this thread has in flight: a thread that closes from inside one of its own
        # calls (a callback) must not wait for itself.
        self._depth = threading.local()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def enter(self) -> None:
        """Count one call in; pair with :meth:`leave` in a ``finally``.

        Raises:
            StoreClosed: the gate is closed (or closing).
        """
        with self._cond:
            if self._closed:
                raise StoreClosed(self._where)
            self._active += 1
        depth = self._depth
        depth.n = getattr(depth, "n", 0) + 1

    def leave(self) -> None:
        """Count one call out, waking a :meth:`close` waiting for the last."""
        depth = self._depth
        depth.n -= 1
        with self._cond:
            self._active -= 1
            if self._closed:
                self._cond.notify_all()

    def close(self) -> bool:
        """Shut the gate and wait until no other thread has a call in flight.

        Returns:
            True the first time, False when the gate was closed already (then the
            caller has nothing to release).
        """
        with self._cond:
            if self._closed:
                return False
            self._closed = True
            mine = getattr(self._depth, "n", 0)
            self._cond.wait_for(lambda: self._active <= mine)
        return True
