"""How far a config expands, measured before anything walks it.

A YAML alias is one Python object reached from many places: a few hundred bytes of anchors
that each repeat the one before nine times (a "billion laughs") load at once, as objects
shared many times over, and expand to billions of values only in the code that walks them
(resolving ``{host: KEY}`` references, merging files, the schema check). An anchor used inside
itself loads as a value that contains itself, and every walk of it recurses until Python
stops it. So each config is measured here first, over its distinct mappings and lists
(each is visited once, its expanded size remembered), in time that grows with the file,
not with its expansion; a config that expands past a bound, or contains itself, or nests
deeper than a config does, is refused with one line.
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
#: gpu-cache's keys nest 4 levels deep; a host's config a few more.
MAX_CONFIG_DEPTH = 64


def _children(value: Any) -> list[tuple[str, Any]]:
    """(the key that names it, the value) for each value in the mapping or list ``value``."""
    if isinstance(value, dict):
        return [(str(key), item) for key, item in value.items()]
    return [(str(number), item) for number, item in enumerate(value)]


def _key_path(where: str, stack: list[list[Any]], last: str) -> str:
    """The dotted key of the value ``last`` in the innermost frame of ``stack``, its middle
    left out past eight keys."""
    keys = [*([where] if where else []), *(str(frame[3]) for frame in stack[1:]), last]
    return ".".join(keys if len(keys) <= 8 else [*keys[:4], "...", *keys[-3:]])


def measure(value: Any, what: str, where: str = "", budget: int = MAX_CONFIG_NODES) -> int:
    """The number of values ``value`` expands to (a mapping's keys counted), each alias
    counted every time it is reached, without expanding it.

    Raises:
        UsageError: the expansion is over ``budget``, ``value`` contains itself, or it nests
            deeper than :data:`MAX_CONFIG_DEPTH`; ``what`` names the config in the message,
            ``where`` the key ``value`` is at.
    """
    if not isinstance(value, (dict, list)):
        return 1
    done: dict[int, int] = {}  # id of a finished mapping or list: its expanded size
    open_ids = {id(value)}  # the mappings and lists being walked: one reached again holds itself
    # each frame: [container, its children, the next child's index, the key it is at, its size]
    stack: list[list[Any]] = [[value, _children(value), 0, where, 1 + len(value) * isinstance(value, dict)]]
    while stack:
        frame = stack[-1]
        container, children, at = frame[0], frame[1], frame[2]
        if at == len(children):
            stack.pop()
            open_ids.discard(id(container))
            done[id(container)] = frame[4]
            if not stack:
                break
            stack[-1][4] += frame[4]
            continue
        frame[2] += 1
        key, item = children[at]
        if not isinstance(item, (dict, list)):
            frame[4] += 1
        elif id(item) in done:
            frame[4] += done[id(item)]
        elif id(item) in open_ids:
            raise UsageError(f"{what}: config key {_key_path(where, stack, key)} contains itself (a YAML "
                             "alias inside its own anchor): write the value out")
        elif len(stack) >= MAX_CONFIG_DEPTH:
            raise UsageError(f"{what}: config key {_key_path(where, stack, key)} nests deeper than "
                             f"{MAX_CONFIG_DEPTH} levels")
        else:
            open_ids.add(id(item))
            stack.append([item, _children(item), 0, key, 1 + len(item) * isinstance(item, dict)])
    total = done[id(value)]
    if total > budget:
        place = f" (config key {where})" if where else ""
        raise UsageError(f"{what}{place} expands to more than {budget} values: YAML aliases that "
                         "repeat one another (a \"billion laughs\"?); write the values out")
    return total
