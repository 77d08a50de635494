"""A registry that misbehaves and a pack that must not travel (issue 37): a registry that stalls,
trickles, redirects or says hostile things (tests/harness/registry_proxy.py in front of the real
one) is one line within its deadline, its text escaped; publish sends only what gpu-cache would
itself read, and fetch writes all layers or none. On the registry and the pack that
tests/conftest.py starts and publishes (``registry_server``, ``published``)."""

from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_cache import oci
from gpu_cache.core import kinds, names
from helpers import clean_environ, read_json, run_cli
from publishing import entries, fetch, one_line, pushed, pushed_manifest
from registry import RegistryServer
from registry_proxy import RegistryProxy

# --- a registry that stalls, trickles, redirects or says hostile things (#37) -------------------

FORGED = "\x1b[2K\rgpu-cache: fetched everything, PASSED\x07\r\ngpu-cache: fetched everything, PASSED"


@pytest.fixture
def proxy(registry_server: RegistryServer):
    """A proxy in front of the module's registry that misbehaves where a test says."""
    with RegistryProxy(registry_server.host) as running:
        yield running


def through(proxy: RegistryProxy, ref: str) -> str:
    """``ref`` with the proxy in place of the registry."""
    return proxy.host + "/" + ref.split("/", 1)[1]


def quick(**more: str) -> dict[str, str]:
    """An environment whose registry timeout is 1 s (so a deadline is 6 s plus 1 s per MiB)."""
    return clean_environ(**{names.REGISTRY_TIMEOUT_VAR: "1", **more})


def no_control_characters(text: str) -> None:
    assert not [c for c in text if not c.isprintable() and c != "\n"], repr(text)


def layer_digest(published: dict[str, Any]) -> str:
    return published["report"]["layers"]["jax"]["digest"]


@pytest.mark.slow  # a daemon, or more than 2 s
def test_a_registry_that_never_answers_the_manifest_is_one_line_within_the_timeout(
    published: dict[str, Any], proxy: RegistryProxy, tmp_path: Path
) -> None:
    """It answers ``/v2/``, then never the manifest: one warning within the timeout, not requests' 300 s."""
    proxy.stall(lambda method, path: "/manifests/" in path)
    started = time.monotonic()
    result = run_cli("fetch", through(proxy, published["ref"]), "--cache-root", str(tmp_path / "root"),
                     "--no-fail", "--output", str(tmp_path / "f.json"), env=quick(), timeout=60)
    assert time.monotonic() - started < 12
    assert result.returncode == 0
    line = one_line(result)
    assert "warning: not fetched" in line and "GET manifests/1" in line, line
    assert read_json(tmp_path / "f.json")["fetched"] is False and not (tmp_path / "root").exists()
    assert ("GET", "/v2/lab/cache/manifests/1") in proxy.seen


@pytest.mark.slow  # a daemon, or more than 2 s
def test_a_trickled_layer_is_cut_at_its_deadline(
    published: dict[str, Any], proxy: RegistryProxy, tmp_path: Path
) -> None:
    """One byte every 0.3 s never trips the 1 s timeout; the transfer's deadline (6 s and 1 s
    per MiB of the layer) ends it, with one line and nothing written."""
    digest = layer_digest(published)
    proxy.trickle(lambda method, path: method == "GET" and path.endswith(digest), interval=0.3)
    started = time.monotonic()
    result = run_cli("fetch", through(proxy, published["ref"]), "--cache-root", str(tmp_path / "root"),
                     "--no-fail", "--output", str(tmp_path / "f.json"), env=quick(), timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 0
    *progress, line = result.stderr.strip().splitlines()  # "fetch: jax layer: 18 B of 242 KiB" each 5 s
    assert all(": jax layer: " in p for p in progress), result.stderr
    assert "warning: not fetched" in line and f"GET blobs/{digest} did not end within 6.2 s" in line, line
    assert 6 < elapsed < 18, elapsed
    assert read_json(tmp_path / "f.json")["fetched"] is False and not (tmp_path / "root").exists()


def test_a_registry_timeout_that_is_no_number_is_one_line(published: dict[str, Any], tmp_path: Path) -> None:
    result = fetch(published["ref"], tmp_path / "root", env=quick(**{names.REGISTRY_TIMEOUT_VAR: "0"}))
    assert result.returncode == 2 and names.REGISTRY_TIMEOUT_VAR in one_line(result)


def test_a_registrys_hostile_error_message_is_escaped(
    published: dict[str, Any], proxy: RegistryProxy, tmp_path: Path
) -> None:
    message = json.dumps({"errors": [{"code": "UNKNOWN", "message": FORGED}]}).encode()
    proxy.answer(lambda method, path: "/manifests/" in path, 500, message)
    for extra in ((), ("--no-fail",)):
        result = fetch(through(proxy, published["ref"]), tmp_path / "root", *extra)
        assert result.returncode == (0 if extra else 1)
        no_control_characters(result.stderr)
        line = one_line(result)
        escaped = "UNKNOWN \\x1b[2K\\x0dgpu-cache: fetched everything, PASSED\\x07\\x0d\\x0agpu-cache"
        assert escaped in line, line
    assert not (tmp_path / "root").exists()


def test_publish_escapes_a_registrys_hostile_error_message(
    published: dict[str, Any], proxy: RegistryProxy, tmp_path: Path
) -> None:
    """The registry refuses the index with words a terminal would obey: publish's error line
    (and its warning with --no-fail) holds them escaped, on one line."""
    message = json.dumps({"errors": [{"code": "DENIED", "message": FORGED}]}).encode()
    proxy.answer(lambda method, path: method == "PUT" and "/manifests/" in path, 400, message)
    ref = through(proxy, published["ref"].replace(":1", ":refused"))
    for extra in ((), ("--no-fail",)):
        result = run_cli("publish", ref, "--cache-root", str(published["root"]), "--verdict",
                         str(published["verdict"]), *extra)
        assert result.returncode == (0 if extra else 1)
        no_control_characters(result.stderr)
        line = one_line(result)
        escaped = "DENIED \\x1b[2K\\x0dgpu-cache: fetched everything, PASSED\\x07\\x0d\\x0agpu-cache"
        assert escaped in line, line


def test_a_manifest_fetched_by_its_digest_is_those_bytes_or_nothing(
    published: dict[str, Any], proxy: RegistryProxy, tmp_path: Path
) -> None:
    """Pinning by digest pins what is fetched: a registry (or a mirror) that serves other
    bytes for the pinned index (here the same pack with another verdict) is refused, nothing
    written; the bytes that hash to it are fetched."""
    digest = published["report"]["digest"]
    raw, _ = oci.Session(oci.parse_reference(published["ref"])).manifest(digest)
    other = json.loads(raw)
    verdict = {"status": "passed", "hits": 99}
    other["manifests"][0]["annotations"]["io.gpu-cache.verdict"] = json.dumps(verdict)
    proxy.answer(lambda method, path: method == "GET" and path.endswith(f"/manifests/{digest}"), 200,
                 json.dumps(other).encode())
    pinned = through(proxy, published["ref"]).rsplit(":", 1)[0] + "@" + digest
    result = fetch(pinned, tmp_path / "root")
    assert result.returncode == 1
    line = one_line(result)
    assert f"the registry served a manifest for {digest} whose bytes hash to sha256:" in line, line
    assert line.endswith("refused, nothing written") and not (tmp_path / "root").exists()
    proxy.faults.clear()
    result = fetch(pinned, tmp_path / "root")
    assert result.returncode == 0, result.stderr
    assert set(entries(tmp_path / "root")) == set(entries(published["root"]))


def big_entry_published(host: str, root: Path, size: int) -> tuple[str, str]:
    """A root whose one entry (a Triton kernel with a cubin of ``size`` random bytes: its layer
    is as large) a validated pass used, published to ``host``: its reference and its layer's
    digest."""
    import kind_examples.triton

    kind = kinds.named("triton")
    key = kind_examples.triton.write(kind.folder(root), 0, size=size)
    record = {"time": time.time(), "run_id": "r", "rule": "validate_cache", "gpu_type": "cpu", "host": "h",
              "pid": 1, "env": {}, "device": {"platform": "cpu", "kinds": ["cpu"], "count": 1},
              "software": {"python": "3.11.7", "image": "lab.sif"}, "triton": {"hits": 1, "hit_keys": [key]}}
    (kinds.named("records").folder(root)).mkdir(parents=True)
    (kinds.named("records").folder(root) / "h-1-1.json").write_text(json.dumps(record))
    verdict = root.parent / "cpu.json"
    verdict.write_text(json.dumps({"gpu_type": "cpu", "passed": True, "status": "passed", "misses": 0,
                                   "device": {"name": "cpu"}}))
    ref = f"{host}/lab/big:1"
    result = run_cli("publish", ref, "--verdict", str(verdict), "--cache-root", str(root), "--json")
    assert result.returncode == 0, result.stderr
    return ref, json.loads(result.stdout)["layers"]["triton"]["digest"]


@pytest.mark.slow  # a daemon, or more than 2 s
def test_a_large_layer_that_arrives_steadily_is_given_time_for_each_mib(
    registry_server: RegistryServer, proxy: RegistryProxy, tmp_path: Path
) -> None:
    """A 12 MiB layer at 1.6 MiB/s takes longer than the floor of every exchange (6 timeouts:
    6 s) and less than its deadline (6 s and a second for each MiB: 18 s): it is fetched
    whole. Held to the floor alone, it would be cut at 6 s."""
    size = 12 << 20
    ref, layer = big_entry_published(registry_server.host, tmp_path / "site-a" / "root", size)
    proxy.trickle(lambda method, path: method == "GET" and path.endswith(layer), interval=0.04,
                  chunk=64 << 10)
    started = time.monotonic()
    result = run_cli("fetch", through(proxy, ref), "--gpu-type", "cpu", "--image", "lab.sif",
                     "--cache-root", str(tmp_path / "root"), env=quick(), timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed > 6, elapsed  # (the proxy's pauses alone take 7.7 s)
    kind = kinds.named("triton")
    (entry,) = kind.scan(kind.folder(tmp_path / "root"), grace_seconds=0.0)
    assert entry.problem is None and entry.size > size


def hostile_index(session: oci.Session, published: dict[str, Any], tag: str) -> None:
    """An index at ``tag`` naming the published pack with annotations a terminal would obey."""
    raw, _ = session.manifest(published["report"]["manifest"])
    entry = {
        "mediaType": oci.MANIFEST_TYPE,
        "digest": published["report"]["manifest"],
        "size": len(raw),
        "annotations": {
            "io.gpu-cache.gpu-type": "h100" + FORGED,
            "io.gpu-cache.arch": "\x1b]0;title\x07sm_90",
            "io.gpu-cache.image": "image\r\nforged",
            "io.gpu-cache.software": json.dumps({"jax": "0.1\x1b[31m"}),
            "io.gpu-cache.verdict": json.dumps({"status": "passed\x9b31m", "hits": 1, "misses": 0}),
            "io.gpu-cache.bytes": "12",
        },
    }
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": [entry]}).encode()
    session.put_manifest(tag, index, "application/vnd.oci.image.index.v1+json")


def test_listing_and_it_has_escape_the_registrys_annotations(
    published: dict[str, Any], registry_server: RegistryServer, tmp_path: Path
) -> None:
    ref = oci.parse_reference(published["ref"])
    hostile_index(oci.Session(ref), published, "hostile")
    result = run_cli("fetch", "--list", f"{ref.name}:hostile")
    assert result.returncode == 0, result.stderr
    no_control_characters(result.stdout)
    assert len(result.stdout.splitlines()) == 3, result.stdout  # the repository, the tag, its one pack
    assert "h100\\x1b[2K\\x0dgpu-cache: fetched everything" in result.stdout
    pack = "(\\x1b]0;title\\x07sm_90): jax 0.1\\x1b[31m in image\\x0d\\x0aforged; passed\\x9b31m"
    assert pack in result.stdout
    result = fetch(f"{ref.name}:hostile", tmp_path / "root", "--gpu-type", "h200")
    assert result.returncode == 1
    no_control_characters(result.stderr)
    assert "has no pack for GPU type h200 (it has: h100\\x1b[2K\\x0d" in one_line(result)


@pytest.mark.slow  # a daemon, or more than 2 s
def test_plain_http_only_to_this_machine_on_every_hop(
    published: dict[str, Any], registry_server: RegistryServer, proxy: RegistryProxy, tmp_path: Path
) -> None:
    """The registry on 127.0.0.1 redirects its blobs to plain HTTP on 127.0.0.2 (a proxy there
    would serve them): refused before any request goes there; to 127.0.0.1 itself they come."""
    with RegistryProxy(registry_server.host, host="127.0.0.2") as elsewhere:
        proxy.redirect(lambda method, path: "/blobs/" in path, f"http://{elsewhere.host}")
        result = fetch(through(proxy, published["ref"]), tmp_path / "root")
        assert result.returncode == 1
        line = one_line(result)
        assert f"request to http://{elsewhere.host}, which is plain HTTP and not this machine" in line, line
        assert elsewhere.seen == [] and not (tmp_path / "root").exists()
    proxy.faults.clear()
    proxy.redirect(lambda method, path: "/blobs/" in path, f"http://{registry_server.host}")
    result = fetch(through(proxy, published["ref"]), tmp_path / "root")
    assert result.returncode == 0, result.stderr
    assert set(entries(tmp_path / "root")) == set(entries(published["root"]))


# --- publish sends only what gpu-cache would itself read; fetch writes all layers or none (#37) ---


def test_entries_another_user_could_have_written_are_not_published(
    published: dict[str, Any], tmp_path: Path
) -> None:
    """One JAX entry owned by nobody, one of mode 0666: left out, counted; a new site gets the rest."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(published["root"], root)
    others, open_to_all = sorted((root / "jax").glob("*-cache"))[:2]
    os.chown(others, 65534, -1)  # nobody
    os.chmod(open_to_all, 0o666)
    result = run_cli("publish", published["ref"].replace(":1", ":owners"), "--cache-root", str(root),
                     "--verdict", str(published["verdict"]), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    reasons = {u["key"]: u["reason"] for u in report["untrusted"]}
    key = {path: path.name.removesuffix("-cache") for path in (others, open_to_all)}
    assert reasons == {key[others]: f"{others.name} is owned by uid 65534",
                       key[open_to_all]: f"{open_to_all.name} is writable by everyone"}
    assert report["layers"]["jax"]["entries"] == len(entries(published["root"])) - 2
    assert "left out 2 entries another user could have written" in run_cli(
        "publish", published["ref"].replace(":1", ":owners"), "--cache-root", str(root),
        "--verdict", str(published["verdict"])).stdout
    result = fetch(published["ref"].replace(":1", ":owners"), tmp_path / "new site")
    assert result.returncode == 0, result.stderr
    assert set(entries(tmp_path / "new site")) == set(entries(published["root"])) - set(reasons)


def autotune_layer(tmp_path: Path, case: str) -> Path:
    """A stable pack of one autotuning result (a second kind beside the JAX layer), made
    ``hostile`` (a link beside it) or ``damaged`` (a byte of the result flipped, its size kept)."""
    from archives import rebuild, special
    from gpu_cache import carry
    from gpu_cache.core import software
    from gpu_cache.core.kinds import autotune_format as autotune_cache

    jax = software.identity()["jax"]
    result = tmp_path / "tuned" / "autotune" / autotune_cache.version_folder("0.0.12", jax) / "cpu.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps({"format": 1, "tokamax": "0.0.12", "jax": jax, "device_kind": "cpu",
                                  "result": "{}"}))
    good = tmp_path / "autotune.tar.gz"
    carry.pack(root=tmp_path / "tuned", archive=good, kinds=["autotune"], stable=True)
    if case == "hostile":
        return rebuild(good, tmp_path / "bad.tar.gz", members=[special("autotune/evil", tarfile.SYMTYPE,
                                                                       link="/etc/passwd")])
    with tarfile.open(good) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()[1:]]  # type: ignore[union-attr]
    (info, data), = members
    flipped = bytes([data[0] ^ 0x01]) + data[1:]
    return rebuild(good, tmp_path / "bad.tar.gz", members=[(info, flipped)], keep=False)


@pytest.mark.parametrize("case", ["hostile", "damaged"])
def test_a_second_layer_that_is_refused_writes_nothing_of_the_first(
    published: dict[str, Any], tmp_path: Path, case: str
) -> None:
    """The published JAX layer, then an autotune layer that unpack refuses: not one JAX entry
    may be written before the second layer is checked."""
    from gpu_cache import carry

    ref = oci.parse_reference(published["ref"])
    session = oci.Session(ref)
    manifest = json.loads(session.manifest(published["report"]["manifest"])[0])
    config = json.loads(session.blob(manifest["config"]["digest"], manifest["config"]["size"], "config"))
    layer = autotune_layer(tmp_path, case)
    with carry.open_archive(layer) as opened:
        config["software_by_kind"]["autotune"] = opened.manifest["software_by_kind"]["autotune"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    digest, size = pushed(session, tmp_path / "config.json")
    manifest["config"].update(digest=digest, size=size)
    digest, size = pushed(session, layer)
    manifest["layers"].append({**manifest["layers"][0], "digest": digest, "size": size,
                               "annotations": {"io.gpu-cache.kind": "autotune"}})
    root = tmp_path / "root"
    result = fetch(f"{ref.name}@{pushed_manifest(session, manifest)}", root)
    assert result.returncode == 1
    line = one_line(result)
    assert "the autotune layer of" in line and "nothing written" in line, line
    assert ("is a symbolic link" if case == "hostile" else "is damaged in the archive") in line
    assert not entries(root) and not root.exists()


@pytest.mark.parametrize("fields", [
    {"passed": False, "status": "error", "misses": 0},   # no workload ran: nothing missed either
    {"passed": False, "status": "failed", "misses": 0},  # it ran, and something differs
    {"passed": True, "status": "error", "misses": 0},    # a verdict that contradicts itself
    {"passed": False, "status": None, "misses": 0},     # one older than the status field
])
def test_a_verdict_that_did_not_pass_is_not_published_without_misses(
    published: dict[str, Any], tmp_path: Path, fields: dict[str, Any]
) -> None:
    verdict = {k: v for k, v in (read_json(published["verdict"]) | fields).items() if v is not None}
    (tmp_path / "v.json").write_text(json.dumps(verdict))
    tag = f"not-passed-{verdict.get('status')}-{verdict['passed']}".lower()  # each case its own
    ref = published["ref"].replace(":1", f":{tag}")
    result = run_cli("publish", ref, "--cache-root", str(published["root"]), "--verdict",
                     str(tmp_path / "v.json"))
    assert result.returncode == 1
    assert f"did not pass ({verdict.get('status')}): only validated caches are published" in one_line(result)
    listed = run_cli("fetch", "--list", published["ref"].rsplit(":", 1)[0], "--json")
    assert tag not in [t["tag"] for t in json.loads(listed.stdout)["tags"]]
