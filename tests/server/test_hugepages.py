"""A shard server's process turns numpy's huge-page advice off, unless the operator's
NUMPY_MADVISE_HUGEPAGE says otherwise (transport/hugepages.py). Each case runs in a fresh
interpreter: the setting is process-wide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
from numpy._core.multiarray import _set_madvise_hugepage
from paramserver.transport.hugepages import no_hugepage_advice
said = no_hugepage_advice()
now = _set_madvise_hugepage(False)  # returns the setting it replaces
print(said, now)
"""


@pytest.mark.parametrize("env,said,advice", [(None, True, False), ("0", True, False),
                                              ("1", False, True)])
def test_the_advice_is_off_unless_the_environment_asks_for_it(env, said, advice):
    environ = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if env is not None:
        environ["NUMPY_MADVISE_HUGEPAGE"] = env
    out = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(said), str(advice)]
