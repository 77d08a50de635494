from pathlib import Path


def write(folder: Path, number: int) -> str:
    """A torch.compile hash folder of vLLM's cache root, with one rank's compiled graph."""
    rank = folder / "torch_compile_cache" / f"{1517964802 + number}" / "rank_0_0" / "backbone"
    rank.mkdir(parents=True)
    (rank / "computation_graph.py").write_text(f"# graph {number}\n" * 200)
    return f"torch_compile_cache/{1517964802 + number}"
