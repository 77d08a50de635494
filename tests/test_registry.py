"""Validated packs through a real OCI registry: ``gpu-cache publish``, ``fetch`` and ``fetch --list``.

Debian's ``docker-registry`` (the CNCF distribution server, tests/harness/registry.py) runs on loopback
with a filesystem store. Root A is warmed and validated on the CPU (the small jax-transformer
workload) and published; fetched into an empty root B at another path, with A moved away, a
real ``gpu-cache validate`` must hit everything. A blob damaged in the registry's storage, a
pack of other software, of another GPU type or with a hostile member is refused with one line,
exit code 1 and nothing written. A registry that misbehaves, and what publish leaves out, in
test_registry_hostile.py.
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

from gpu_cache import oci
from gpu_cache.config.settings import settings_from
from gpu_cache.core import names
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
from processes import free_port
from publishing import (
    CONFIG,
    OTHER_PYTHON,
    entries,
    fetch,
    needs_registry,
    one_line,
    pushed,
    pushed_manifest,
    warm_and_validate,
)
from registry import RegistryServer

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
