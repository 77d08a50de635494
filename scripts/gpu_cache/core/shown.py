"""Text from records, archives and the filesystem as a terminal may show it.

A record is whatever a process left in the records folder: a host, rule or function name in it
may hold ESC sequences that drive the terminal, a BEL, or a newline that forges a line of the
report ("cpu on cpu: PASSED"). Every line a text report prints goes through :func:`shown`:
what is not printable is escaped the way Python writes it in a string literal. ``--json`` needs
none of this (JSON escapes control characters itself).
"""

from __future__ import annotations

from collections.abc import Iterable


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: str) -> str:
    """``text`` as one line: control characters (a newline, ESC, BEL, DEL, C1 codes), line and
    paragraph separators, bidirectional overrides and lone surrogates escaped (``\\x1b``)."""
    if text.isprintable():  # the usual case, at the speed of one C loop
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def shown_lines(lines: Iterable[str]) -> str:
    """``lines`` (each one line of a report, as its renderer meant it) as the text to print."""
    return "".join(shown(line) + "\n" for line in lines)


def clipped(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was where it is cut."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def excerpt(value: object, limit: int = 60) -> str:
    """``value`` as a message quotes it: its ``repr`` (what is not printable escaped by
    :func:`shown` later) cut to about ``limit`` characters, with how long it was where it is
    cut. Never the ``repr`` of all of a long value: a config's string of 800 MB (YAML aliases
    of one long string) made a message of 800 MB."""
    import reprlib

    cut = reprlib.Repr()
    cut.maxstring = cut.maxother = cut.maxlong = limit
    cut.maxlist = cut.maxtuple = cut.maxdict = cut.maxset = 4
    cut.maxlevel = 2
    if isinstance(value, int) and value.bit_length() > 3 * limit:
        try:
            return f"a whole number of {len(str(abs(value)))} digits"
        except ValueError:  # str() refuses more than 4,300 digits
            return f"a whole number of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = cut.repr(value)
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return f"{text} ({len(value)} characters)"
    if isinstance(value, (list, tuple, dict)) and len(value) > 4:
        return f"{text} ({len(value)} values)"
    return text
