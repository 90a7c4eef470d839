"""The nearest known word to a misspelt one, for errors that suggest the fix."""

from __future__ import annotations

import difflib
import reprlib


def nearest(word: str, known, cutoff: float = 0.6) -> str | None:
    """The known word closest to `word`, or None when none is close."""
    found = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(word: str, known) -> str:
    """' (did you mean X?)' for the nearest known word, else ''."""
    near = nearest(word, known)
    return f" (did you mean {near}?)" if near else ""


# Values from peers and files are formatted into refusals: the repr is cut by depth and length
# as it is built, so a container nested a thousand deep (under msgpack's and json's own
# limits) cannot raise RecursionError, nor a huge one cost its full text.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 3, 6, 6, 6
_SHOWN.maxstring, _SHOWN.maxlong, _SHOWN.maxother = 60, 40, 60


def shown(value, width: int = 80) -> str:
    """`value`'s repr for an error line: bounded in depth and at most `width` characters."""
    text = _SHOWN.repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."
