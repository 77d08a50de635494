"""How far a config expands, measured before anything walks it.

A YAML alias is one Python object reached from many places: a few hundred bytes of anchors
that each repeat the one before nine times (a "billion laughs") load at once, as objects
shared many times over, and expand to billions of values only in the code that walks them
(resolving ``{host: KEY}`` references, merging files, the schema check, whose messages hold
the ``repr`` of a value). The same holds for text: 2,000 aliases of one 400 KB string are
2,000 values but 800 MB of text (the schema check took 1.55 GB and 6 s over it). An anchor
used inside itself loads as a value that contains itself, and every walk of it recurses until
Python stops it; so does a value nested hundreds of levels deep (``--config-json``, a config
Snakemake read). So each config is measured here first, over its distinct mappings and lists
(each is visited once, its expanded size remembered), in time that grows with the file, not
with its expansion; a config that expands past a bound of values or of text, nests deeper
than :data:`MAX_NESTING` or contains itself is refused with one line.
"""

from __future__ import annotations

from typing import Any

from gpu_cache.core.errors import UsageError

#: A config holds a few hundred values; more means YAML aliases that repeat one another.
MAX_CONFIG_NODES = 100_000
#: Characters of text (keys and values) a config may expand to: what a config file may hold
#: (``settings.MAX_CONFIG_BYTES``); gpu-cache's own is a few KB.
MAX_CONFIG_TEXT = 1 << 20
#: A whole file read for gpu-cache (a host's config may be large): a file of at most
#: ``settings.MAX_CONFIG_BYTES`` (1 MiB) that holds more values than it has bytes, or more
#: than 16 times its text, repeats itself through aliases.
MAX_FILE_NODES = 1 << 20
MAX_FILE_TEXT = 16 << 20
#: Levels of mappings and lists: a config has a few (gpu_types.a100.resources.gres); the
#: schema check and JSON recurse once or more per level.
MAX_NESTING = 100


def _frame(value: Any, key: str) -> list[Any]:
    """What the walk keeps of a mapping or list ``value`` at ``key``: [it, (key, value) of each
    of its values, the index of the next one, ``key``, its values so far (itself and its
    keys), its characters of text so far (its keys')]."""
    if isinstance(value, dict):
        items = [(str(k), item) for k, item in value.items()]
        return [value, items, 0, key, 1 + len(items), sum(len(k) for k, _ in items)]
    return [value, [(str(number), item) for number, item in enumerate(value)], 0, key, 1, 0]


def _text(value: Any) -> int:
    """The characters a value that is not a mapping or list takes (a number: about its digits)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, int):
        return 1 + value.bit_length() // 3
    return 1


def _key_path(where: str, stack: list[list[Any]], last: str) -> str:
    """The dotted key of the value ``last`` in the innermost frame of ``stack``; past six
    levels, its first four and an ellipsis."""
    parts = [*([where] if where else []), *(str(frame[3]) for frame in stack[1:]), last]
    return ".".join(parts) if len(parts) <= 6 else ".".join(parts[:4]) + "..."


def measure(value: Any, what: str, where: str = "", budget: int = MAX_CONFIG_NODES,
            text_budget: int = MAX_CONFIG_TEXT) -> None:
    """Check the number of values ``value`` expands to (a mapping's keys counted, an alias
    each time it is reached) and their characters of text, without expanding it.

    Raises:
        UsageError: the expansion is over ``budget`` values or ``text_budget`` characters,
            ``value`` nests deeper than :data:`MAX_NESTING`, or contains itself; ``what``
            names the config in the message, ``where`` the key ``value`` is at.
    """
    if not isinstance(value, (dict, list)):
        return
    done: dict[int, tuple[int, int]] = {}  # id of a finished mapping or list: its size, its text
    walking = {id(value)}  # the mappings and lists being walked: one reached again holds itself
    stack = [_frame(value, where)]
    while stack:
        frame = stack[-1]
        if frame[2] == len(frame[1]):
            stack.pop()
            walking.discard(id(frame[0]))
            done[id(frame[0])] = (frame[4], frame[5])
            if stack:
                stack[-1][4] += frame[4]
                stack[-1][5] += frame[5]
            continue
        key, item = frame[1][frame[2]]
        frame[2] += 1
        if not isinstance(item, (dict, list)):
            frame[4] += 1
            frame[5] += _text(item)
        elif id(item) in done:
            frame[4] += done[id(item)][0]
            frame[5] += done[id(item)][1]
        elif id(item) in walking:
            raise UsageError(f"{what}: config key {_key_path(where, stack, key)} contains itself (a YAML "
                             "alias inside its own anchor): write the value out")
        elif len(stack) >= MAX_NESTING:
            raise UsageError(f"{what}: config key {_key_path(where, stack, key)} nests deeper than "
                             f"{MAX_NESTING} levels of mappings and lists; a config has a few")
        else:
            walking.add(id(item))
            stack.append(_frame(item, key))
    values, text = done[id(value)]
    place = f" (config key {where})" if where else ""
    if values > budget:
        raise UsageError(f"{what}{place} expands to more than {budget} values: YAML aliases that "
                         "repeat one another (a \"billion laughs\"?); write the values out")
    if text > text_budget:
        raise UsageError(f"{what}{place} expands to more than {text_budget} characters of text: YAML "
                         "aliases that repeat a long value; write the values out")
