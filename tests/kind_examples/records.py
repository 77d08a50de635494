import json
from pathlib import Path


def write(folder: Path, number: int) -> str:
    """A record of one process, as the startup hook writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"host-{1000 + number}-{number}.json"
    (folder / name).write_text(json.dumps({"time": 1.0 + number, "run_id": f"run{number}", "host": "h",
                                           "pid": 1000 + number, "env": {}, "padding": "x" * 500}))
    return name
