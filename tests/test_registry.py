"""Validated packs through a real OCI registry: ``gpu-cache publish``, ``fetch`` and ``fetch --list``.

Debian's ``docker-registry`` (the CNCF distribution server, tests/harness/registry.py) runs on loopback
with a filesystem store. Root A is warmed and validated on the CPU (the small jax-transformer
workload) and published; fetched into an empty root B at another path, with A moved away, a
real ``gpu-cache validate`` must hit everything. A blob damaged in the registry's storage, a
pack of other software, of another GPU type or with a hostile member is refused with one line,
exit code 1 and nothing written.
"""

from __future__ import annotations

import base64
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from daemons import free_port
from gpu_cache import oci
from gpu_cache.config.settings import settings_from
from gpu_cache.core import kinds, names
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import jax_format as jax_cache
from helpers import (
    PROFILE,
    SMALL,
    SNAKEFILE,
    clean_environ,
    read_json,
    run_cli,
    run_snakemake,
    unavailable,
    workdir_with_config,
)
from registry import RegistryServer, missing_requirements
from registry_proxy import RegistryProxy

CONFIG = json.dumps({**SMALL, "validate": {"measure_cold": False}})
OTHER_PYTHON = "/root/.pyenv/versions/3.9.18/bin/python"  # a Python without jax


def needs_registry() -> None:
    missing = missing_requirements()
    if missing:
        unavailable(f"the registry tests need {', '.join(missing)} (run .ci/install-registry.sh as root)")


@pytest.fixture(scope="module")
def registry_server(tmp_path_factory: pytest.TempPathFactory):
    needs_registry()
    with RegistryServer(tmp_path_factory.mktemp("registry")) as server:
        yield server


def warm_and_validate(root: Path, work: Path) -> Path:
    """Warm ``root`` on the CPU and validate it; the verdict's path."""
    for command in ("warm", "validate"):
        result = run_cli(
            command,
            "--config-json",
            CONFIG,
            "--cache-root",
            str(root),
            "--output",
            str(work / f"{command}.json"),
            "--log",
            str(work / f"{command}.log"),
        )
        assert result.returncode == 0, result.stderr
    assert read_json(work / "validate.json")["passed"] is True
    return work / "validate.json"


@pytest.fixture(scope="module")
def published(registry_server: RegistryServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Root A, warmed, validated and published to ``<registry>/lab/cache:1`` (do not change it)."""
    work = tmp_path_factory.mktemp("site-a")
    root = work / "a root"
    verdict = warm_and_validate(root, work)
    ref = f"{registry_server.host}/lab/cache:1"
    result = run_cli(
        "publish",
        ref,
        "--cache-root",
        str(root),
        "--verdict",
        str(verdict),
        "--output",
        str(work / "publish.json"),
    )
    assert result.returncode == 0, result.stderr
    return {
        "root": root,
        "verdict": verdict,
        "ref": ref,
        "report": read_json(work / "publish.json"),
        "stdout": result.stdout,
    }


def fetch(ref: str, root: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return run_cli("fetch", ref, "--cache-root", str(root), *args, env=env)


def one_line(result: Any) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def entries(root: Path) -> dict[str, Any]:
    return {e.key: e for e in kinds.named("jax").scan(root / "jax", grace_seconds=0.0)}


# --- the round trip -----------------------------------------------------------------------------


def test_publish_names_what_was_validated(published: dict[str, Any], registry_server: RegistryServer) -> None:
    report = published["report"]
    assert report["published"] is True and report["gpu_type"] == "cpu"
    assert report["layers"]["jax"]["entries"] == len(entries(published["root"])) > 0
    assert set(report["layers"]) == {"jax"}  # the workload compiles no Triton kernel
    assert f"@{report['digest']}" in published["stdout"]
    result = run_cli("fetch", "--list", f"{registry_server.host}/lab/cache")
    assert result.returncode == 0, result.stderr
    assert f"1  {registry_server.host}/lab/cache@{report['digest']}" in result.stdout
    assert (
        "cpu (cpu-" in result.stdout
        and "jax 0.10.2" in result.stdout
        and "passed, 6 hits, 0 misses" in result.stdout
    )
    # ... and what its outputs were proven to be (issue 40), in the artifact's annotations.
    raw, _ = oci.Session(oci.parse_reference(published["ref"])).manifest(report["manifest"])
    proof = json.loads(json.loads(raw)["annotations"]["io.gpu-cache.outputs"])
    assert proof["mode"] == "identical" and proof["identical"] == 1 and proof["outputs differ"] == 0, proof


def test_fetched_elsewhere_validation_hits_everything(published: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "elsewhere" / "b root"
    result = fetch(published["ref"], root)
    assert result.returncode == 0, result.stderr
    digest = published["report"]["digest"]
    assert result.stdout.startswith(
        f"fetched {published['ref'].rsplit(':', 1)[0]}@{digest} (from {published['ref']})"
    )
    assert set(entries(root)) == set(entries(published["root"]))
    for entry in entries(root).values():  # an arrival is a use: prune must not take them as old
        assert time.time() - entry.last_use < 120
    away = published["root"].with_name("moved away")
    published["root"].rename(away)  # nothing may read site A's root now
    try:
        result = run_cli(
            "validate",
            "--config-json",
            CONFIG,
            "--cache-root",
            str(root),
            "--output",
            str(tmp_path / "v.json"),
            "--log",
            str(tmp_path / "v.log"),
        )
    finally:
        away.rename(published["root"])
    assert result.returncode == 0, result.stderr
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["misses"] == 0 and verdict["new_entries"] == 0 and verdict["hits"] == len(entries(root))


def test_fetch_by_digest_and_existing_entries_are_kept(published: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "root"
    pinned = published["ref"].rsplit(":", 1)[0] + "@" + published["report"]["digest"]
    assert fetch(pinned, root).returncode == 0
    before = {k: e.last_use for k, e in entries(root).items()}
    result = fetch(pinned, root, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["digest"] == published["report"]["digest"]
    assert report["unpacked"]["jax"]["kept_newer"]["jax"] == len(before)  # a good entry here stays
    assert {k: e.last_use for k, e in entries(root).items()} == before


def test_republishing_unchanged_entries_moves_no_layer(published: dict[str, Any], tmp_path: Path) -> None:
    """Hits move file times and JAX's -atime records; the layer must keep its digest."""
    root = tmp_path / "used root"
    result = fetch(published["ref"], root)
    assert result.returncode == 0, result.stderr
    verdict = warm_and_validate(root, tmp_path)  # real hits, at another path, later
    for number, entry in enumerate(entries(root).values()):
        entry.source.last_use = time.time() - number  # as a size-capped JAX records each use
        jax_cache.write_atime(root / "jax", entry.source)
    ref = published["ref"].replace(":1", ":again")
    result = run_cli("publish", ref, "--cache-root", str(root), "--verdict", str(verdict), "--json")
    assert result.returncode == 0, result.stderr
    again = json.loads(result.stdout)
    assert again["layers"]["jax"]["digest"] == published["report"]["layers"]["jax"]["digest"]
    assert again["layers"]["jax"]["uploaded"] is False


# --- refusals: nothing written ----------------------------------------------------------------


@pytest.mark.slow  # a daemon, or more than 2 s
def test_a_blob_damaged_in_the_registry_is_refused(tmp_path: Path) -> None:
    needs_registry()
    with RegistryServer(tmp_path / "registry") as server:  # its own store: the damage stays here
        verdict = warm_and_validate(tmp_path / "a", tmp_path)
        ref = f"{server.host}/lab/damaged:1"
        result = run_cli(
            "publish", ref, "--cache-root", str(tmp_path / "a"), "--verdict", str(verdict), "--json"
        )
        assert result.returncode == 0, result.stderr
        blob = server.blob_path(json.loads(result.stdout)["layers"]["jax"]["digest"])
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0x01  # one bit, the size kept
        blob.write_bytes(bytes(data))
        root = tmp_path / "b"
        result = fetch(ref, root)
        assert result.returncode == 1
        line = one_line(result)
        assert "jax layer is damaged in the registry" in line and "nothing written" in line
        assert not root.exists()
        result = fetch(ref, root, "--no-fail", "--output", str(tmp_path / "f.json"))
        assert result.returncode == 0 and "warning: not fetched" in one_line(result)
        assert read_json(tmp_path / "f.json")["fetched"] is False and not root.exists()


def test_other_software_is_refused(published: dict[str, Any], tmp_path: Path) -> None:
    if not os.access(OTHER_PYTHON, os.X_OK):
        unavailable(f"{OTHER_PYTHON} is missing")
    root = tmp_path / "root"
    result = fetch(published["ref"], root, "--python", OTHER_PYTHON)
    assert result.returncode == 1
    line = one_line(result)
    assert "jax entries were made with jax 0.10.2" in line and "has no jax (Python 3.9" in line
    assert line.endswith("refused, nothing written") and not root.exists()


def test_another_gpu_type_is_refused(published: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "root"
    result = fetch(published["ref"], root, "--gpu-type", "h200")
    assert result.returncode == 1
    assert "has no pack for GPU type h200 (it has: cpu)" in one_line(result)
    # The cpu artifact itself, named by its digest, for an h200 site.
    manifest = published["ref"].rsplit(":", 1)[0] + "@" + published["report"]["manifest"]
    result = fetch(manifest, root, "--gpu-type", "h200")
    assert result.returncode == 1
    assert "is a pack of GPU type 'cpu', not h200" in one_line(result)
    assert not root.exists()


def test_a_hostile_layer_is_refused(
    published: dict[str, Any], registry_server: RegistryServer, tmp_path: Path
) -> None:
    """A layer with a symbolic link beside its entries, under a manifest that fits this site."""
    from archives import rebuild, special

    ref = oci.parse_reference(published["ref"])
    session = oci.Session(ref)
    raw, _ = session.manifest(published["report"]["manifest"])
    manifest = json.loads(raw)
    layer = tmp_path / "jax.tar.gz"
    layer.write_bytes(session.blob(manifest["layers"][0]["digest"], manifest["layers"][0]["size"], "layer"))
    hostile = rebuild(
        layer, tmp_path / "hostile.tar.gz", members=[special("jax/evil", tarfile.SYMTYPE, link="/etc/passwd")]
    )
    digest, size = pushed(session, hostile)
    manifest["layers"][0].update(digest=digest, size=size)
    root = tmp_path / "root"
    result = fetch(f"{ref.name}@{pushed_manifest(session, manifest)}", root)
    assert result.returncode == 1
    line = one_line(result)
    assert "archive member 'jax/evil' is a symbolic link" in line and "nothing written" in line
    assert not root.exists()


def pushed(session: oci.Session, path: Path) -> tuple[str, int]:
    """The file at ``path`` uploaded as a blob: its digest and size."""
    data = path.read_bytes()
    session.upload(path, oci.sha256_digest(data), len(data), path.name)
    return oci.sha256_digest(data), len(data)


def pushed_manifest(session: oci.Session, manifest: dict[str, Any]) -> str:
    """``manifest`` put into the registry under its digest, which it returns."""
    raw = json.dumps(manifest).encode()
    session.put_manifest(oci.sha256_digest(raw), raw, oci.MANIFEST_TYPE)
    return oci.sha256_digest(raw)


# --- logins, unreachable registries, retiring ---------------------------------------------------


def test_htpasswd_login_from_the_environment_and_docker_config(
    published: dict[str, Any], tmp_path: Path
) -> None:
    needs_registry()
    with RegistryServer(tmp_path / "registry", users={"lab": "s3cret"}) as server:
        ref = f"{server.host}/lab/private:1"
        args = ("--cache-root", str(published["root"]), "--verdict", str(published["verdict"]))
        result = run_cli("publish", ref, *args)
        assert result.returncode == 1
        assert f"registry {server.host} asks for a login" in one_line(result)
        result = run_cli(
            "publish",
            ref,
            *args,
            env=clean_environ(**{names.REGISTRY_USERNAME_VAR: "lab", names.REGISTRY_PASSWORD_VAR: "wrong"}),
        )
        assert result.returncode == 1 and "401" in one_line(result)
        result = run_cli(
            "publish",
            ref,
            *args,
            env=clean_environ(**{names.REGISTRY_USERNAME_VAR: "lab", names.REGISTRY_PASSWORD_VAR: "s3cret"}),
        )
        assert result.returncode == 0, result.stderr
        docker = tmp_path / "docker"
        docker.mkdir()
        (docker / "config.json").write_text(
            json.dumps({"auths": {server.host: {"auth": base64.b64encode(b"lab:s3cret").decode()}}})
        )
        result = fetch(ref, tmp_path / "root", env=clean_environ(**{oci.DOCKER_CONFIG_VARIABLE: str(docker)}))
        assert result.returncode == 0, result.stderr
        assert len(entries(tmp_path / "root")) == len(entries(published["root"]))


@pytest.mark.slow  # a daemon, or more than 2 s
def test_an_unreachable_registry_is_one_warning(tmp_path: Path) -> None:
    ref = f"127.0.0.1:{free_port()}/lab/cache:1"  # nothing listens there
    started = time.monotonic()
    result = fetch(ref, tmp_path / "root", "--no-fail")
    assert result.returncode == 0
    assert "warning: not fetched" in one_line(result) and "cannot be reached" in one_line(result)
    assert time.monotonic() - started < 15
    result = fetch(ref, tmp_path / "root")
    assert result.returncode == 1 and "cannot be reached" in one_line(result)
    assert not (tmp_path / "root").exists()


def test_a_failed_verdict_is_not_published(published: dict[str, Any], tmp_path: Path) -> None:
    verdict = read_json(published["verdict"]) | {"passed": False, "status": "failed", "misses": 2}
    (tmp_path / "failed.json").write_text(json.dumps(verdict))
    result = run_cli(
        "publish",
        published["ref"].replace(":1", ":failed"),
        "--cache-root",
        str(published["root"]),
        "--verdict",
        str(tmp_path / "failed.json"),
    )
    assert result.returncode == 1
    assert "did not pass (failed): only validated caches are published" in one_line(result)


def test_retiring_a_tag(published: dict[str, Any], registry_server: RegistryServer) -> None:
    ref = published["ref"].replace(":1", ":old")
    args = ("--cache-root", str(published["root"]), "--verdict", str(published["verdict"]))
    assert run_cli("publish", ref, *args).returncode == 0
    result = run_cli("publish", ref, "--retire")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"retired {ref}")
    listed = run_cli("fetch", "--list", f"{registry_server.host}/lab/cache", "--json")
    assert "old" not in [t["tag"] for t in json.loads(listed.stdout)["tags"]]
    assert fetch(published["ref"], published["root"].parent / "still").returncode == 0  # the others stay


def test_references_and_plain_http_only_for_this_machine() -> None:
    ref = oci.parse_reference("registry.example.org/lab/af3-cache:2.6.2")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        "registry.example.org",
        "lab/af3-cache",
        "2.6.2",
        None,
    )
    assert oci.base_url(ref) == "https://registry.example.org"
    assert oci.base_url(oci.parse_reference("localhost:5000/x:1")) == "http://localhost:5000"
    assert oci.base_url(oci.parse_reference("127.0.0.1:5000/x:1")) == "http://127.0.0.1:5000"
    assert oci.base_url(oci.parse_reference("127.0.0.1.example.org/x:1")).startswith("https://")
    for bad in ("lab/af3-cache:1", "registry.example.org/Lab/x", "registry.example.org/x@sha256:12",
                "registry.example.org/x:1\n"):
        with pytest.raises(UsageError):
            oci.parse_reference(bad)


# --- the workflow: registry.publish after a passed validation, registry.fetch before warming ------


def run_workflow(tmp_path: Path, name: str, root: Path, registry: dict[str, str]) -> tuple[Any, Path]:
    work = workdir_with_config(
        tmp_path / name, {**SMALL, "validate": {"measure_cold": False}, "registry": registry}
    )
    result = run_snakemake(
        work,
        "-s",
        SNAKEFILE,
        "--profile",
        PROFILE,
        "--cores",
        "2",
        env=clean_environ(GPU_CACHE_ROOT=str(root)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, work / "results" / "gpu-cache"


def test_workflow_publishes_then_another_site_starts_warm(
    registry_server: RegistryServer, tmp_path: Path
) -> None:
    tag = f"{registry_server.host}/lab/workflow:1"
    _, site_a = run_workflow(tmp_path, "a", tmp_path / "a root", {"publish": tag})
    published = read_json(site_a / "publish" / "cpu.json")
    assert published["published"] is True, published
    pinned = f"{registry_server.host}/lab/workflow@{published['digest']}"
    _, site_b = run_workflow(tmp_path, "b", tmp_path / "elsewhere" / "b root", {"fetch": pinned})
    fetched = read_json(site_b / "fetch" / "cpu.json")
    assert fetched["fetched"] is True and fetched["digest"] == published["digest"]
    assert fetched["unpacked"]["jax"]["written"]["jax"] == published["layers"]["jax"]["entries"]
    warm = read_json(site_b / "warm" / "cpu.json")
    assert sum(warm["new_entries"].values()) == 0, warm["new_entries"]  # nothing left to compile
    assert warm["remade"] == {}, warm["remade"]  # nor to compile again: the pack brought its proof
    verdict = read_json(site_b / "validate" / "cpu.json")
    assert verdict["passed"] is True and verdict["misses"] == 0 and verdict["new_entries"] == 0


@pytest.mark.slow  # a daemon, or more than 2 s
def test_workflow_with_an_unreachable_registry_warms_as_without(tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{free_port()}/lab/cache"
    _, site = run_workflow(
        tmp_path, "c", tmp_path / "root", {"fetch": f"{nowhere}@sha256:{'0' * 64}", "publish": f"{nowhere}:1"}
    )
    assert read_json(site / "fetch" / "cpu.json")["fetched"] is False
    assert read_json(site / "publish" / "cpu.json")["published"] is False
    assert read_json(site / "validate" / "cpu.json")["passed"] is True
    logs = site.parent.parent / "logs" / "gpu-cache"
    assert "cannot be reached" in (logs / "fetch" / "cpu.log").read_text()


def test_a_gpu_types_own_registry_keys_win_key_by_key() -> None:
    pinned = f"registry.example.org/lab/cache@sha256:{'a' * 64}"
    config = {"registry": {"fetch": pinned, "publish": "registry.example.org/lab/cache:1"},
              "gpu_types": {"h200": {"registry": {"publish": None}}, "a100": {}}}
    assert oci.references(config, "h200") == (pinned, None)
    assert oci.references(config, "a100") == (pinned, "registry.example.org/lab/cache:1")
    with pytest.raises(UsageError, match=r"registry\.fetch"):  # a tag could be moved: pin a digest
        settings_from({"registry": {"fetch": "registry.example.org/lab/cache:1"}})


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
