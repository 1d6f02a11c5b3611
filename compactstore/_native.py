"""``compactstore._native``: a second name of :mod:`compactstore.native`, the native core.

Importing it gives the extension module itself (the same object), so code that imports
the native core by this name gets it. Nothing in the package imports this name.
"""

import sys

from . import native

sys.modules[__name__] = native
