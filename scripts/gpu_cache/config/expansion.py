"""How far a config expands, measured before anything walks it.

A YAML alias is one Python object reached from many places: a few hundred bytes of anchors
that each repeat the one before nine times (a "billion laughs") load at once, as objects
shared many times over, and expand to billions of values only in the code that walks them
(resolving ``{host: KEY}`` references, merging files, the schema check). An anchor used inside
itself loads as a value that contains itself, and every walk of it recurses until Python
stops it. So each config is measured here first, over its distinct mappings and lists
(each is visited once, its expanded size remembered), in time that grows with the file,
not with its expansion; a config that expands past a bound or contains itself is refused
with one line. (Nesting needs no bound of its own: PyYAML stops at about 500 levels, which
the walks after this take.)
"""

from __future__ import annotations

from typing import Any

from gpu_cache.core.errors import UsageError

#: A config holds a few hundred values; more means YAML aliases that repeat one another.
MAX_CONFIG_NODES = 100_000
#: A whole file read for gpu-cache (a host's config may be large): a file of at most
#: ``settings.MAX_CONFIG_BYTES`` (1 MiB) that holds more values than it has bytes repeats
#: itself through aliases.
MAX_FILE_NODES = 1 << 20


def _frame(value: Any, key: str) -> list[Any]:
    """What the walk keeps of a mapping or list ``value`` at ``key``: [it, (key, value) of each
    of its values, the index of the next one, ``key``, its size so far (itself and its keys)]."""
    if isinstance(value, dict):
        return [value, [(str(k), item) for k, item in value.items()], 0, key, 1 + len(value)]
    return [value, [(str(number), item) for number, item in enumerate(value)], 0, key, 1]


def _key_path(where: str, stack: list[list[Any]], last: str) -> str:
    """The dotted key of the value ``last`` in the innermost frame of ``stack``."""
    return ".".join([*([where] if where else []), *(str(frame[3]) for frame in stack[1:]), last])


def measure(value: Any, what: str, where: str = "", budget: int = MAX_CONFIG_NODES) -> None:
    """Check the number of values ``value`` expands to (a mapping's keys counted, an alias
    each time it is reached) without expanding it.

    Raises:
        UsageError: the expansion is over ``budget``, or ``value`` contains itself; ``what``
            names the config in the message, ``where`` the key ``value`` is at.
    """
    if not isinstance(value, (dict, list)):
        return
    done: dict[int, int] = {}  # id of a finished mapping or list: its expanded size
    walking = {id(value)}  # the mappings and lists being walked: one reached again holds itself
    stack = [_frame(value, where)]
    while stack:
        frame = stack[-1]
        if frame[2] == len(frame[1]):
            stack.pop()
            walking.discard(id(frame[0]))
            done[id(frame[0])] = frame[4]
            if stack:
                stack[-1][4] += frame[4]
            continue
        key, item = frame[1][frame[2]]
        frame[2] += 1
        if not isinstance(item, (dict, list)):
            frame[4] += 1
        elif id(item) in done:
            frame[4] += done[id(item)]
        elif id(item) in walking:
            raise UsageError(f"{what}: config key {_key_path(where, stack, key)} contains itself (a YAML "
                             "alias inside its own anchor): write the value out")
        else:
            walking.add(id(item))
            stack.append(_frame(item, key))
    if done[id(value)] > budget:
        place = f" (config key {where})" if where else ""
        raise UsageError(f"{what}{place} expands to more than {budget} values: YAML aliases that "
                         "repeat one another (a \"billion laughs\"?); write the values out")
