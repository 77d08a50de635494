import hashlib
from pathlib import Path


def write(folder: Path, number: int) -> str:
    """An FX graph's key folder, ``fxgraph/<shard>/<key>/<content hash>``."""
    key = "f" + hashlib.sha256(b"inductor %d" % number).hexdigest()[:51]
    entry = folder / "fxgraph" / key[1:3] / key
    entry.mkdir(parents=True)
    (entry / hashlib.sha256(key.encode()).hexdigest()[:20]).write_bytes(b"a pickled graph %d " % number * 300)
    return f"fxgraph/{key[1:3]}/{key}"


def fetch(tier, key: str) -> None:
    """As the Inductor piece fetches the shared tree (every file the local tier lacks)."""
    tier.fetch_tree("inductor")


def promote(tier, key: str) -> None:
    """As the Inductor piece promotes its tree at exit."""
    tier.promote_tree("inductor")


def recorded(keys: list[str]) -> dict:
    """What a record of the process that compiled ``keys`` says: the FX graphs' own keys."""
    return {"inductor": {"hits": len(keys), "hit_keys": [key.rpartition("/")[2] for key in keys]}}
