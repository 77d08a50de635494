"""What moves whole entries of every registered cache kind between folders keeps the kind
contract (docs/kinds.md): the node-local tier fetches, promotes and trims only whole entries
nobody else may have written; pack and unpack, publish and fetch (through the registry
tests/conftest.py starts) carry whole entries and leave foreign ones out. Each kind's entries
are written as the kind writes them (harness/kind_entries.py)."""

from __future__ import annotations

import json
import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from gpu_cache.core import kinds
from gpu_cache.core.kinds import Kind, integrity
from helpers import hook_piece
from kind_entries import DAY, cli, entry_of, examples, first_file, flip, prune, whole, written

TIERED = [pytest.param(kind, id=kind.name) for kind in kinds.ALL if kind.tiered]


def tier_of(local: Path, shared: Path):
    """The startup hook's node-local tier of a job whose cache root is ``shared``."""
    return hook_piece("tier").Tier(str(local), str(shared), 0, None)


def tree(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` with its bytes (none of gpu-cache's own)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != ".gpu-cache-verified"}


@pytest.mark.parametrize("kind", TIERED)
def test_the_tier_fetches_only_whole_entries_nobody_else_may_have_written(kind, tmp_path):
    """Three entries in the shared tier, sealed by a prune: one then damaged (one bit, size and
    mtime kept), one made writable by everyone. The hook's fetch serves the third as it is, and
    neither of the others: both are counted in the record, and the damaged one is set aside in
    the shared tier. Guards: the seal and trust checks of gpu_cache_hook.tier's fetch."""
    root, local = tmp_path / "root", tmp_path / "tier"
    keys = written(root, kind, count=3)
    prune(root, kind.name)  # seals what it finds whole
    damaged = first_file(kind, entry_of(root, kind, keys[0]))
    flip(damaged)
    open_to_all = first_file(kind, entry_of(root, kind, keys[1]))
    os.chmod(open_to_all, 0o666)
    tier = tier_of(local, root)
    for key in keys:
        examples(kind).fetch(tier, key)
    counts = tier.record(kind.name)
    assert counts["damaged"] == 1 and counts["untrusted"] >= 1, counts  # (a tree: at each fetch)
    assert not os.path.lexists(damaged), "set aside in the shared tier"
    fetched = tree(kind.folder(local))
    shared = tree(kind.folder(root))
    assert whole(local, kind) == [keys[2]]
    for path in fetched:  # what it fetched is byte for byte the shared tier's
        assert not path.startswith(".gpu-cache-tmp")
    third = first_file(kind, entry_of(local, kind, keys[2]))
    relative = os.path.relpath(third, kind.folder(local))
    assert fetched[relative] == shared[relative] or kind.name == "triton"  # (a group names local paths)
    assert os.path.relpath(damaged, kind.folder(root)) not in fetched
    assert os.path.relpath(open_to_all, kind.folder(root)) not in fetched


@pytest.mark.parametrize("kind", TIERED)
def test_the_tier_promotes_whole_entries_and_never_over_one_there(kind, tmp_path):
    """Two entries a job wrote in its local tier; the shared tier already holds the first one
    (another node promoted it first). Promotion places the second whole (the shared tier's
    scan finds it whole) and leaves the first one's files as they were, not one replaced (a
    reader there may be reading them). Guard: gpu_cache_hook.tier.files.link_new (a new name only,
    never a replacement)."""
    root, local = tmp_path / "root", tmp_path / "tier"
    keys = written(local, kind, count=2)
    assert written(root, kind, count=1) == keys[:1]  # (the same entry, in files of its own)
    before = {p: os.stat(p).st_ino for p in map(str, kind.folder(root).rglob("*"))}
    tier = tier_of(local, root)
    for key in keys:
        examples(kind).promote(tier, key)
    assert {p: os.stat(p).st_ino for p in before} == before, "an entry there is never replaced"
    assert sorted(whole(root, kind)) == sorted(keys)
    assert prune(root, kind.name)[kind.name]["entries_removed"] == 0


@pytest.mark.parametrize("kind", TIERED)
def test_the_tiers_bound_trims_whole_entries_least_recently_used_first(kind, tmp_path):
    """Three entries in a job's node-local tier, used 3, 2 and 1 days ago, and a bound that holds
    two: the hook's bound at exit removes the oldest whole (none of its files left) and keeps
    the others whole. On a node where ``gpu-cache prune`` never runs, this bound is the only
    one. Guard: the kind's tier layout that its hook piece declares (gpu_cache_hook.tier.bound)."""
    root, local = tmp_path / "root", tmp_path / "tier"
    keys = written(local, kind, count=3)
    keys.sort(reverse=True)  # (the least recently used is not the first by key)
    files = {}
    for days, key in zip((3, 2, 1), keys, strict=True):
        tops = kind.files(entry_of(local, kind, key))
        files[key] = [p for top in tops for p, _info in integrity.files_of(top)]
        for path in [*tops, *files[key]]:
            os.utime(path, (time.time() - days * DAY,) * 2, follow_symlinks=False)
    bound = sum(os.lstat(p).st_size for key in keys[1:] for p in files[key])
    layouts = hook_piece("tier").layouts(hook_piece("names").pieces())
    tier = hook_piece("tier").Tier(str(local), str(root), bound, None, layouts)
    assert tier.trim() == 1
    assert not any(os.path.lexists(p) for p in files[keys[0]]), "the oldest entry goes whole"
    assert all(stat.S_ISREG(os.lstat(p).st_mode) for key in keys[1:] for p in files[key])
    assert sorted(whole(local, kind)) == sorted(keys[1:])


CARRIED = [pytest.param(kind, id=kind.name) for kind in kinds.ALL if kind.carry is not None]


def foreign(root: Path, kind: Kind, keys: list[str]) -> None:
    """The first entry of ``keys`` made another user's, a file of the second writable by all."""
    os.chown(entry_of(root, kind, keys[0]).path, pwd.getpwnam("nobody").pw_uid, -1, follow_symlinks=False)
    os.chmod(first_file(kind, entry_of(root, kind, keys[1])), 0o666)


def same_files(kind: Kind, root: Path, other: Path, key: str) -> None:
    """The entry ``key`` has the same files with the same bytes in both roots."""
    def files(top: Path) -> dict[str, bytes]:
        return {os.path.relpath(p, kind.folder(top)): Path(p).read_bytes()
                for t in kind.files(entry_of(top, kind, key)) for p, _info in integrity.files_of(t)}

    theirs, mine = files(root), files(other)
    assert theirs.keys() == mine.keys() and (theirs == mine or kind.name == "triton")  # (a group: its paths)


@pytest.mark.parametrize("kind", CARRIED)
def test_pack_and_unpack_carry_whole_entries_and_leave_foreign_ones_out(kind, tmp_path):
    """Three entries, one another user's and one with a file everyone may write: ``pack`` leaves
    those two out and counts them, ``unpack`` at another root writes the third whole, as it was.
    Guards: pack's read rule (carry/_pack.py) and the kind's carry part."""
    root, other, archive = tmp_path / "root", tmp_path / "other", tmp_path / "carry.tar"
    keys = written(root, kind, count=3)
    foreign(root, kind, keys)
    report = cli("pack", str(archive), "--kind", kind.name, "--json", "--cache-root", str(root))
    assert sorted(u["key"] for u in report["untrusted"]) == sorted(keys[:2]), report
    assert report["entries"] == {kind.name: 1} and report["skipped"] == []
    unpacked = cli("unpack", str(archive), "--force", "--json", "--cache-root", str(other))
    assert unpacked["written"] == {kind.name: 1} and unpacked["damaged"] == [], unpacked
    assert whole(other, kind) == keys[2:]
    same_files(kind, root, other, keys[2])



@pytest.mark.slow
@pytest.mark.parametrize("kind", CARRIED)
def test_publish_and_fetch_carry_whole_entries_and_leave_foreign_ones_out(kind, registry_server, tmp_path):
    """Three entries a validated pass used, one another user's and one with a file everyone may
    write: ``publish`` leaves those two out and counts them, ``fetch`` at a new site writes the
    third whole. Guards: publish's read rule (carry/_pack.py) and the kind's carry part."""
    root, other = tmp_path / "root", tmp_path / "other"
    keys = written(root, kind, count=3)
    foreign(root, kind, keys)
    module = examples(kind)
    used = module.recorded(keys) if hasattr(module, "recorded") else \
        {kind.name: {"hits": len(keys), "hit_keys": keys}}
    record = {"time": time.time(), "run_id": "r", "rule": "validate_cache", "gpu_type": "cpu", "host": "h",
              "pid": 1, "env": {}, "device": {"platform": "cpu", "kinds": ["cpu"], "count": 1},
              "software": {"python": "3.11.7", "image": "lab.sif"}, **used}
    assert kind.carry.recorded_keys(json.loads(json.dumps(record))) >= set(keys)
    records = kinds.named("records").folder(root)
    records.mkdir(parents=True)
    (records / "h-1-1.json").write_text(json.dumps(record))
    verdict = tmp_path / "cpu.json"
    verdict.write_text(json.dumps({"gpu_type": "cpu", "passed": True, "status": "passed", "misses": 0,
                                   "device": {"name": "cpu"}}))
    ref = f"{registry_server.host}/contract/{kind.name.replace('_', '-')}:1"
    report = cli("publish", ref, "--verdict", str(verdict), "--json", "--cache-root", str(root))
    assert sorted(u["key"] for u in report["untrusted"]) == sorted(keys[:2]), report
    assert report["layers"][kind.name]["entries"] == 1
    fetched = cli("fetch", ref, "--gpu-type", "cpu", "--image", "lab.sif", "--json",
                  "--cache-root", str(other))
    assert fetched["unpacked"][kind.name]["written"] == {kind.name: 1}, fetched
    assert whole(other, kind) == keys[2:]
    same_files(kind, root, other, keys[2])
