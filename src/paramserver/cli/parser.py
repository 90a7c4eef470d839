"""The command line's parser: argparse, with every refusal said error first.

A refused command prints one line saying what is wrong (argparse's message, which names the
flag, and the grammar's examples for a value), then at most one hint: the nearest flag for a
misspelt one, the nearest choice for a misspelt name, else where the help is. Never the usage
block before it, never a traceback; exit status 2.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys

_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")
_CHOICE = re.compile(r"argument ([^:]+): invalid choice: '([^']*)' \(choose from (.*)\)")


def nearest(word: str, candidates, cutoff: float = 0.6) -> str | None:
    """The candidate closest to `word` (a typo's intended spelling), or None."""
    found = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1,
                                      cutoff=cutoff)
    return found[0] if found else None


class CommandParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors come first (see the module's text). Subcommands'
    parsers are made of the same class. `elsewhere`: flags another command takes that this
    one does not, each with where its setting lives here; said in place of the nearest flag."""

    elsewhere: dict[str, str] = {}  # (a command sets its own; this one is never written)

    def error(self, message: str):  # noqa: D401 - argparse's hook
        lines = [f"{self.prog}: {message}"]
        hint = self.hint(message)
        lines.append(hint or f"(`{self.prog} --help` lists the options)")
        sys.stderr.write("\n".join(lines) + "\n")
        raise SystemExit(2)

    def hint(self, message: str) -> str | None:
        m = _UNRECOGNIZED.match(message)
        if m:
            for token in m.group(1).split():
                if token.split("=", 1)[0] in self.elsewhere:
                    name = token.split("=", 1)[0]
                    return f"{name} is not {self.prog}'s: {self.elsewhere[name]}"
                if token.startswith("-"):
                    near = nearest(token.split("=", 1)[0], self._option_string_actions)
                    if near:
                        return f"did you mean {near}? (`{self.prog} --help` lists the options)"
            return None
        m = _CHOICE.match(message)
        if m:
            choices = [c.strip().strip("'") for c in m.group(3).split(",")]
            near = nearest(m.group(2), choices)
            return f"did you mean {near}?" if near else None
        return None

    def unrecognized(self, extra: list[str]) -> None:
        """Refuse arguments a (sub)command's parser did not take, naming the nearest flag."""
        self.error(f"unrecognized arguments: {' '.join(extra)}")
