"""The nearest known word to a misspelt one, for errors that suggest the fix."""

from __future__ import annotations

import difflib


def nearest(word: str, known, cutoff: float = 0.6) -> str | None:
    """The known word closest to `word`, or None when none is close."""
    found = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(word: str, known) -> str:
    """' (did you mean X?)' for the nearest known word, else ''."""
    near = nearest(word, known)
    return f" (did you mean {near}?)" if near else ""
