"""Give freed memory back to the operating system between chunks.

Each chunk allocates many large temporaries (torch CPU tensors come from malloc). glibc keeps freed
heap memory for reuse, and with chunks of varying shapes the heap fragments, so the resident size
would creep up with the number of chunks processed although nothing is kept. ``malloc_trim(0)``
after a chunk returns those pages; measured in docs/benchmarks.md (flat peak RSS from 2M to 20M rows).
On other C libraries this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_free_memory() -> None:
    """Return free heap pages to the OS (glibc ``malloc_trim``); does nothing elsewhere.

    >>> release_free_memory()
    """
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
