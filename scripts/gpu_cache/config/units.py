"""Sizes (``10G``) and ages (``30d``) as users write them, and back."""

from __future__ import annotations

import math
import re

from gpu_cache.core.errors import UsageError
from gpu_cache.core.shown import excerpt

# "10G" and "10GiB" mean 10 GiB, as du -h and SLURM's --mem read them; "10GB" means 10^9
# bytes, as Snakemake and ccache read it. humanfriendly.parse_size reads "10G" as 10^9, so
# it does not do exactly this.
_PREFIXES = "KMGTP"
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B)?\s*$", re.IGNORECASE)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
#: Larger numbers are a typo, not a size or an age (and would overflow a float).
_MAX_DIGITS = 30


def parse_size(text: str | int) -> int:
    """Bytes in a size like ``10G`` or ``10GiB`` (binary), ``10GB`` (decimal), ``500M``,
    ``1.5T`` or ``4096``.

    Raises:
        UsageError: the text is not a non-negative size with a known unit.
    """
    if isinstance(text, bool):
        raise UsageError(f"size {text!r} is not a size; write it like 10G, 500M or 4096")
    if isinstance(text, int):
        if text < 0:
            raise UsageError(f"size {text} is negative; write it like 10G, 500M or 4096")
        return text
    match = _SIZE_RE.match(str(text))
    if not match or len(match.group(1)) > _MAX_DIGITS:
        raise UsageError(
            f"size {excerpt(text, 40)} is not understood; write a number with one of the units "
            "K, M, G, T (binary, also KiB, MiB, ...) or KB, MB, GB, TB (decimal), e.g. 10G or 500M"
        )
    number, prefix, suffix = match.groups()
    power = _PREFIXES.find(prefix.upper()) + 1 if prefix else 0
    base = 1000 if suffix and suffix.upper() == "B" and prefix else 1024
    return int(float(number) * base**power)


def parse_age(text: str | int) -> float:
    """Seconds in an age like ``30d``, ``12h``, ``15m``, ``90s``, ``2w`` or a plain number of seconds.

    Raises:
        UsageError: the text is not a non-negative age with a known unit.
    """
    if isinstance(text, bool):
        raise UsageError(f"age {text!r} is not an age; write it like 30d, 12h or 15m")
    if isinstance(text, (int, float)):
        if not math.isfinite(text) or abs(text) >= 10**_MAX_DIGITS:
            raise UsageError(f"age {text} is not a finite number of seconds; write it like 30d")
        if text < 0:
            raise UsageError(f"age {text} is negative; write it like 30d, 12h or 15m")
        return float(text)
    match = _AGE_RE.match(str(text))
    if not match or len(match.group(1)) > _MAX_DIGITS:
        raise UsageError(
            f"age {excerpt(text, 40)} is not understood; write a number with one of the units "
            "s, m, h, d, w, e.g. 30d or 12h"
        )
    number, unit = match.groups()
    return float(number) * _AGE_UNITS[unit or "s"]


def format_size(n_bytes: float) -> str:
    """A short human size: ``0 B``, ``512 B``, ``1.5 KiB``, ``10.0 GiB``."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_age(seconds: float) -> str:
    """A short human age: ``45s``, ``12m``, ``3.5h``, ``2.0d``."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
