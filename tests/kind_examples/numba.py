import hashlib
import pickle
from pathlib import Path


def write(folder: Path, number: int) -> str:
    """A function's entry as numba 0.68 writes it with ``NUMBA_CACHE_DIR``: in its source
    folder's cache folder, the index ``<module>.<function>-<line>.py311.nbi`` (numba's version,
    then the source's stamp and the overloads) and one data file per overload."""
    source = folder / f"jobs_{hashlib.sha1(b'/home/me/jobs').hexdigest()}"
    source.mkdir(parents=True, exist_ok=True)
    stem = f"model.f{number}-{10 + number}.py311"
    overloads = {("(int64,)", "x86_64"): f"{stem}.1.nbc", ("(float64,)", "x86_64"): f"{stem}.2.nbc"}
    with open(source / f"{stem}.nbi", "wb") as index:
        pickle.dump("0.68.1", index, protocol=-1)
        index.write(pickle.dumps(((1_700_000_000.0 + number, 512), overloads)))
    for data in overloads.values():
        (source / data).write_bytes(pickle.dumps(("an object file", bytes(range(256)) * 8, number)))
    return f"{source.name}/{stem}"
