import importlib.util
import sys
from pathlib import Path


def write(folder: Path, number: int) -> str:
    """One ``.pyc`` in an interpreter's folder, as Python writes it."""
    code = compile(f"VALUE = {number}\n" * 50, f"mod{number}.py", "exec")
    data = importlib.util.MAGIC_NUMBER + b"\0" * 12 + __import__("marshal").dumps(code)
    relative = f"{sys.implementation.cache_tag}-example/mod{number}.{sys.implementation.cache_tag}.pyc"
    (folder / relative).parent.mkdir(parents=True, exist_ok=True)
    (folder / relative).write_bytes(data)
    return relative
