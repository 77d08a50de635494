import json
from pathlib import Path

from gpu_cache.core.kinds import autotune_format as autotune_cache


def write(folder: Path, number: int) -> str:
    """gpu-cache's wrapper of one tokamax result, in its versions' folder."""
    device = f"NVIDIA H{number}00"
    key = f"{autotune_cache.version_folder('0.0.12', '0.8.1')}/{autotune_cache.file_name(device)}"
    (folder / key).parent.mkdir(parents=True, exist_ok=True)
    (folder / key).write_text(json.dumps({"format": autotune_cache.FORMAT, "tokamax": "0.0.12",
                                          "jax": "0.8.1", "device_kind": device, "result": "{}" + " " * 500}))
    return key


def recorded(keys: list[str]) -> dict:
    """What a record of the process that loaded ``keys`` says: the autotune piece's part."""
    return {"autotune": {"autotuning": {"versions": ["0.0.12", "0.8.1"], "entries": len(keys),
                                       "loaded": [key.rpartition("/")[2] for key in keys]}}}
