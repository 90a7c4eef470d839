"""numpy's huge-page advice, turned off in a shard server's process (beside keep_freed_memory:
the process's memory settings, made before it serves).

On Linux numpy advises the kernel to back every array of 4 MB or more with transparent huge
pages (madvise MADV_HUGEPAGE). Where the kernel's THP `defrag` setting is `madvise` (Debian's
and Ubuntu's default), a page fault in such an array compacts memory on the spot when no huge
page is free, and on a host whose memory is fragmented (a long-lived, shared machine) that
stalls. A shard's sparse tables touch fresh memory as long as keys keep arriving (rows, and a
key index that doubles): measured on this project's 2-core test machine, a first 128 MB array
took 167 ms to fill with the advice and 55 ms without, and a table taking 2,400 batches of
Zipf keys 1.20 against 1.60 ms a batch. Without the advice the kernel still hands out huge
pages when it has them free (THP `enabled=always`); it only stops compacting for them.

NUMPY_MADVISE_HUGEPAGE, when set, is the operator's choice and is left as it says.
"""

from __future__ import annotations

import os


def no_hugepage_advice() -> bool:
    """Turn numpy's huge-page advice off for arrays made from now on in this process, unless
    NUMPY_MADVISE_HUGEPAGE says otherwise. Returns whether it is off."""
    if os.environ.get("NUMPY_MADVISE_HUGEPAGE") is not None:
        return os.environ["NUMPY_MADVISE_HUGEPAGE"].strip() == "0"
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # (numpy < 2 spells it numpy.core; another numpy may not have it)
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            return False
    _set_madvise_hugepage(False)
    return True
