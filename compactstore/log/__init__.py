"""The parts of a session that :class:`compactstore.store.Session` stands in front of.

- :mod:`.caches`: what a store handle keeps between calls, one object under one lock;
- :mod:`.heads`: tree heads as the latest sealed head vouches for them, span roots, proofs;
- :mod:`.reader`: the one verifying reader, which every read that decides, copies or
  serves goes through, and which builders read a session through (it is their
  :class:`~compactstore.view.SessionView`);
- :mod:`.commit`: the one commit, and the admission of every derived event inside it.

Nothing here is public API: the session's methods are.
"""
