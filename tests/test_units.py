"""Pure functions, no subprocess: the prune plan, the validation judge, GPU type names, the
explanation of a JAX miss and the zstd frame walk. (Settings, sizes and ages:
test_units_settings.py.)"""

import random

import pytest

from gpu_cache.commands.explain import account, explain_records
from gpu_cache.commands.prune import plan
from gpu_cache.commands.validate import NAMED_MISSES, judge
from gpu_cache.core import kinds
from gpu_cache.core.device import gpu_type_of
from gpu_cache.core.kinds import Entry
from gpu_cache.core.kinds.jax_explain import explain_key
from gpu_cache.core.kinds.jax_frames import ZstdFrame
from gpu_cache.core.reports import Missed
from gpu_cache.reports import KindCounts

DAY = 86400.0
NOW = 1_000 * DAY

# --- prune.plan(entries, max_size, max_age, now) -> [(entry, reason)] in removal order -------------


def entry(key: str, size: int = 100, days_ago: float = 1.0, problem: str | None = None) -> Entry:
    return Entry(kind="jax", key=key, name=key, size=size, last_use=NOW - days_ago * DAY,
                 problem=problem, source=None)


def planned(entries: list[Entry], max_size: int = 1 << 40, max_age: float = 30 * DAY) -> list[tuple]:
    return [(e.key, reason) for e, reason in plan(entries, max_size, max_age, NOW)]


def test_plan_keeps_everything_young_and_under_the_cap():
    assert planned([entry("a"), entry("b")], max_size=200) == []


def test_plan_calls_a_broken_entry_broken_whatever_its_age():
    result = planned([entry("bad", days_ago=40, problem="0-byte -cache file")])
    assert result == [("bad", "broken: 0-byte -cache file")]


def test_plan_removes_broken_entries_before_too_old_ones_whatever_the_scan_order():
    result = planned([entry("old", days_ago=40), entry("bad", days_ago=0, problem="0-byte -cache file")])
    assert result == [("bad", "broken: 0-byte -cache file"), ("old", "unused longer than max_age")]


def test_plan_removes_entries_unused_longer_than_max_age():
    result = planned([entry("a", days_ago=31), entry("b", days_ago=29)], max_age=30 * DAY)
    assert result == [("a", "unused longer than max_age")]


def test_plan_broken_then_too_old_then_lru_until_under_max_size():
    entries = [entry("lru1", days_ago=5), entry("lru2", days_ago=4), entry("new", days_ago=1),
               entry("bad", problem="truncated"), entry("old", days_ago=60)]
    result = planned(entries, max_size=100)
    assert [key for key, _ in result] == ["bad", "old", "lru1", "lru2"]
    assert result[2][1] == result[3][1] == "least recently used over max_size"


def test_plan_lru_stops_as_soon_as_the_rest_fits():
    entries = [entry("a", size=300, days_ago=3), entry("b", size=300, days_ago=2), entry("c", size=300)]
    assert planned(entries, max_size=600) == [("a", "least recently used over max_size")]


def test_plan_lru_ignores_the_size_of_what_already_goes():
    # The broken entry's bytes do not count towards the cap: the others fit without LRU.
    entries = [entry("bad", size=1000, problem="truncated"), entry("a"), entry("b")]
    assert [key for key, _ in planned(entries, max_size=200)] == ["bad"]


def test_plan_lru_ties_go_by_key():
    entries = [entry("b", days_ago=2), entry("c", days_ago=2), entry("a", days_ago=2)]
    assert [key for key, _ in planned(entries, max_size=100)] == ["a", "b"]


def test_plan_lru_goes_by_last_use_not_by_key():
    # Ages against key order (#19): by key the first two to go would be "a" and "b".
    entries = [entry("a", days_ago=1), entry("b", days_ago=9), entry("c", days_ago=5), entry("d", days_ago=3)]
    assert [key for key, _ in planned(entries, max_size=200)] == ["b", "c"]


# --- validate.judge(counts, missed, failures, cache_problems) -> problems ----------------------


def counts(jax_misses: int = 0, triton_misses: int = 0) -> dict[str, KindCounts]:
    return {"jax": KindCounts(misses=jax_misses), "triton": KindCounts(misses=triton_misses)}


def missed(kind: str, *names: str) -> list[Missed]:
    return [Missed(kind, name, f"{name}-key") for name in names]


def test_judge_passes_without_misses_failures_or_problems():
    assert judge(counts(), [], [], []) == []


def test_judge_lists_cache_problems_then_failures():
    assert judge(counts(), [], ["run 1 failed"], ["jax: cannot create"]) == ["jax: cannot create",
                                                                                 "run 1 failed"]


def test_judge_names_the_missed_computations_of_each_kind():
    names = missed("jax", "jit_f", "jit_g") + missed("triton", "kernel")
    (problem,) = judge(counts(jax_misses=2), names, [], [])
    assert problem.startswith("jax: 2 compilation(s) missed in a fresh process after warming: jit_f, jit_g.")
    assert "gpu-cache doctor --explain" in problem and "kernel" not in problem


def test_judge_shortens_a_long_list_of_misses():
    names = [f"jit_{i}" for i in range(NAMED_MISSES + 3)]
    (problem,) = judge(counts(triton_misses=len(names)), missed("triton", *names), [], [])
    assert f"jit_{NAMED_MISSES - 1} and 3 more." in problem and f"jit_{NAMED_MISSES}," not in problem


def test_judge_reports_misses_even_without_their_names():
    (problem,) = judge(counts(jax_misses=1), [], [], [])
    assert problem.startswith("jax: 1 compilation(s) missed")


# --- device.gpu_type_of(product name) -> a wildcard-safe gpu_type ------------------------------


@pytest.mark.parametrize("name,gpu_type", [
    ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"), ("A100-SXM4-80GB", "a100"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA L40S", "l40s"), ("Tesla V100-PCIE-16GB", "v100"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("", "gpu"), ("NVIDIA", "gpu"),
])
def test_gpu_type_of(name, gpu_type):
    assert gpu_type_of(name) == gpu_type


# --- explain.explain_key(key, record, earlier): which key parts changed, and why ----------------

PARTS = {"computation": "c1", "jax_lib version": "j1", "XLA flags": "x1", "compile_options": "o1",
         "accelerator_config": "a1", "compression": "z1"}


def record(time: float, key: str, changed: dict[str, str] | None = None, rule: str = "job",
           env: dict | None = None, missed_keys: tuple[str, ...] = ()) -> dict:
    """A stats-hook record of one process that computed ``key`` from PARTS, some ``changed``."""
    return {"time": time, "host": "node1", "pid": 1, "rule": rule, "gpu_type": "cpu", "run_id": rule,
            "env": env or {}, "jax": {"key_parts": {key: PARTS | (changed or {})}, "key_context": {},
                                      "missed": [{"key": k} for k in missed_keys]}}


def test_explain_names_the_changed_part_and_its_concrete_cause():
    before = record(1.0, "jit_f-aaa", env={})
    now = record(2.0, "jit_f-bbb", {"XLA flags": "x2"}, env={"XLA_FLAGS": "--xla_foo"})
    result = explain_key("jit_f-bbb", now, [before])
    assert result["changed"] == ["XLA flags"]
    assert result["compared_with"]["key"] == "jit_f-aaa"
    assert result["causes"][0].startswith("XLA_FLAGS changed from None to '--xla_foo'")
    assert result["causes"][-1].startswith("XLA flags: XLA_FLAGS (or --xla_* command-line flags) differ")


def test_explain_compares_with_the_closest_earlier_key_of_the_same_name():
    far = record(3.0, "jit_f-far", {"computation": "c9", "compression": "z9"})
    near = record(1.0, "jit_f-near", {"compression": "z9"})
    other_name = record(4.0, "jit_g-ggg")
    result = explain_key("jit_f-now", record(5.0, "jit_f-now"), [far, near, other_name])
    assert result["compared_with"]["key"] == "jit_f-near" and result["changed"] == ["compression"]


def test_explain_prefers_the_latest_of_equally_close_keys():
    older = record(1.0, "jit_f-old", {"compression": "z9"})
    newer = record(2.0, "jit_f-new", {"compression": "z9"})
    result = explain_key("jit_f-now", record(5.0, "jit_f-now"), [older, newer])
    assert result["compared_with"]["key"] == "jit_f-new"


def test_explain_a_never_seen_computation_is_a_first_compile():
    result = explain_key("jit_f-aaa", record(2.0, "jit_f-aaa"), [record(1.0, "jit_g-bbb")])
    assert result["compared_with"] is None and result["changed"] == []
    assert "no earlier run computed jit_f" in result["causes"][0]


def test_explain_the_same_key_seen_before_was_not_written_or_pruned():
    result = explain_key("jit_f-aaa", record(2.0, "jit_f-aaa"), [record(1.0, "jit_f-aaa")])
    assert result["changed"] == [] and "the same key was computed before" in result["causes"][0]


def test_explain_without_key_parts_says_so():
    result = explain_key("jit_f-aaa", {"time": 1.0, "jax": {}}, [])
    assert "recorded no key parts" in result["causes"][0]


def test_explain_records_takes_the_latest_run_with_misses_against_earlier_ones():
    first = record(1.0, "jit_f-aaa", rule="warm")
    second = record(2.0, "jit_f-bbb", {"computation": "c2"}, missed_keys=("jit_f-bbb",))
    later_without_misses = record(3.0, "jit_f-ccc", rule="other")
    (item,) = explain_records([later_without_misses, second, first])
    assert item["key"] == "jit_f-bbb" and item["compared_with"]["rule"] == "warm"
    assert item["changed"] == ["computation"]


def test_explain_accounts_for_each_miss_of_a_kind_that_explains_none(tmp_path):
    """A kind the startup hook observes that has no explain part: ``doctor --explain`` still
    accounts for each of its misses, those its record names one by one (their entry was not in
    the cache), the rest as unnamed. Guard: account's plain explanation of such a kind."""
    kind = next((k for k in kinds.OBSERVED if k.explain is None), None)
    if kind is None:
        pytest.skip("every observed kind explains its misses")
    section = {"hits": 0, "misses": 3, "missed": [{"name": "f", "key": "k1"}]}
    (group,) = account([{"time": 1.0, "rule": "job", "env": {}, kind.name: section}], tmp_path)
    assert (group["kind"], group["misses"]) == (kind.name, 3)
    unnamed, named = group["causes"]
    assert unnamed == {"cause": "the process compiled more than its record could name", "misses": 2,
                       "processes": 1, "keys": []}
    assert named["misses"] == 1 and named["keys"] == [
        {"name": "f", "key": "k1", "compared_with": None, "changed": [],
         "causes": ["its entry was not in the cache"]}]


# --- jax.ZstdFrame: is a zstd frame whole, from its headers alone ------------------------------


def zstd_problem(chunks) -> str | None:
    """Why the bytes in ``chunks`` are not one whole zstd frame, or None."""
    frame = ZstdFrame()
    for chunk in chunks:
        frame.feed(chunk)
    return frame.finish()

_RANDOM = random.Random(21)
#: What JAX compresses (an executable: some of it compressible, some not), and edge cases.
PLAIN = {"empty": b"", "one byte": b"x", "random 300": _RANDOM.randbytes(300),
         "zeros 1 MiB": bytes(1 << 20), "mixed 700 KiB": _RANDOM.randbytes(300_000) + bytes(400_000),
         "repeats": b"abc" * 100_000}
#: How zstandard may write a frame: JAX uses the defaults (content size, no checksum).
SETTINGS = {"as JAX": {}, "checksum": {"write_checksum": True},
            "no content size": {"write_content_size": False}, "level 19": {"level": 19},
            "fast -5": {"level": -5}}


def frames() -> list[tuple[str, bytes]]:
    zstandard = pytest.importorskip("zstandard")  # (the test extra installs it)
    return [(f"{name}, {how}", zstandard.ZstdCompressor(**kwargs).compress(data))
            for name, data in PLAIN.items() for how, kwargs in SETTINGS.items()]


def test_zstd_frames_that_zstandard_wrote_are_whole_in_any_chunking():
    for name, frame in frames():
        assert zstd_problem([frame]) is None, name
        assert zstd_problem([frame[i:i + 7] for i in range(0, len(frame), 7)]) is None, name
        assert zstd_problem([frame[:1], b"", frame[1:]]) is None, name
    walked = ZstdFrame()
    walked.feed(dict(frames())["mixed 700 KiB, as JAX"])
    # Raw blocks for the random part (128 KiB at most each), compressed ones for the zeros.
    assert walked.plain >= 300_000 and walked.compressed >= 1 and walked.finish() is None


def block_starts(frame: bytes) -> list[int]:
    """Where each block header of ``frame`` starts (RFC 8878, read here on its own)."""
    descriptor = frame[4]
    single = bool(descriptor & 0x20)
    position = 5 + (not single) + (0, 1, 2, 4)[descriptor & 3] + (int(single), 2, 4, 8)[descriptor >> 6]
    starts = []
    while True:
        starts.append(position)
        header = int.from_bytes(frame[position:position + 3], "little")
        position += 3 + (1 if (header >> 1) & 3 == 1 else header >> 3)
        if header & 1:
            return starts


def test_a_zstd_frame_cut_short_anywhere_is_truncated():
    for name, frame in frames():
        # Every cut in the headers, around each block header and in the checksum; a sample
        # of the rest (all of it would take a minute).
        cuts = {*range(min(len(frame), 64)), *range(max(0, len(frame) - 16), len(frame)),
                *range(0, len(frame), 997)}
        cuts |= {start + step for start in block_starts(frame) for step in (-1, 0, 1, 2, 3, 4)}
        for length in sorted(c for c in cuts if 0 <= c < len(frame)):
            problem = zstd_problem([frame[:length]])
            assert problem is not None and "truncated" in problem, (name, length)


def test_a_zstd_frame_with_bytes_after_it_or_a_bad_header_is_broken():
    zstandard = pytest.importorskip("zstandard")
    frame = zstandard.ZstdCompressor().compress(PLAIN["mixed 700 KiB"])
    assert "after the end" in zstd_problem([frame, b"\0"])
    assert "not a zstd frame" in zstd_problem([b"\x28\xb5\x2f\xfe" + frame[4:]])
    assert "reserved bit" in zstd_problem([frame[:4], bytes([frame[4] | 0x08]), frame[5:]])
    # The first block's type set to 3 (reserved) is corrupt.
    first, *_more = block_starts(frame)
    header = int.from_bytes(frame[first:first + 3], "little") | 0b110
    reserved = frame[:first] + header.to_bytes(3, "little") + frame[first + 3:]
    assert "cannot be" in zstd_problem([reserved])
    # A content size its blocks cannot give: 700 KiB (a 4-byte field, just before the first
    # block) announced as 7 bytes.
    assert frame[4] >> 6 == 2
    assert "announces" in zstd_problem([frame[:first - 4] + (7).to_bytes(4, "little") + frame[first:]])
