"""Run a module as ``__main__`` and say on stderr where its exit spends its time.

    python tests/benchmarks/exit_trace.py MODULE [ARGS...]

Every exit handler registered after this starts (torch's, the startup hook's record and tier
work: the hook registers them when a watched library is imported) is timed; stderr gets one
``EXIT-TRACE <what> <unix time>`` line when the module's main returns (``main-done``), one per
handler when it returns (``handler <module.name> <seconds>``), and one when the last handler
has run (``atexit-done``). What follows until the process ends is the interpreter's own
finalization (its garbage collection, C++ destructors). tests/benchmarks/torch_compile_gpu.py
reads these lines.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
import time
from collections.abc import Callable
from typing import Any

MARK = "EXIT-TRACE"


def say(what: str) -> None:
    os.write(2, f"{MARK} {what} {time.time():.4f}\n".encode())


def timed_register(register: Callable[..., Any]) -> Callable[..., Any]:
    """``atexit.register`` whose handlers say how long each took."""

    def wrapper(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        name = f"{getattr(func, '__module__', None)}.{getattr(func, '__qualname__', func)}".replace(" ", "_")

        def handler(*inner: Any, **named: Any) -> Any:
            began = time.perf_counter()
            try:
                return func(*inner, **named)
            finally:
                say(f"handler {name} {time.perf_counter() - began:.4f}")

        register(handler, *args, **kwargs)
        return func  # as atexit.register does (it is used as a decorator)

    return wrapper


def main() -> None:
    module, sys.argv = sys.argv[1], sys.argv[1:]
    atexit.register(say, "atexit-done")  # the first registered runs last
    atexit.register = timed_register(atexit.register)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        say("main-done")
        raise SystemExit(exc.code) from None
    say("main-done")


if __name__ == "__main__":
    main()
