"""The shipped Snakemake profiles (profiles/): one start-up block, the same in each."""

from __future__ import annotations

from pathlib import Path

from helpers import REPO


def start_block(profile: Path) -> str:
    """A shipped profile's start-up block: from ``__use_yte__`` to its export."""
    text = (profile / "config.yaml").read_text()
    end = "        export_from_profile()\n"
    return text[text.index("__use_yte__: true\n"):text.index(end) + len(end)]


def test_every_shipped_profile_starts_with_the_same_block():
    profiles = sorted((REPO / "profiles").iterdir())
    assert [p.name for p in profiles] == ["gpu-cache", "slurm"]
    assert len({start_block(p) for p in profiles}) == 1
