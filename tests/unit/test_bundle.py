"""Bundles (issue 44): the manifest, reading a bundle file as a hostile one (path traversal, links, devices, size
bombs, a corrupted or truncated file, a member changed after the manifest was written), gpuk8s's writer, coverage
and the SBOM. The bundles here are made in the writer's shape (a pax tar, manifest.json first, zstd-compressed by
the zstd program) with Python's tarfile, which also writes the hostile ones: it writes whatever it is asked to."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.bundle import archive, manifest
from gpuk8s.bundle.archive import BundleError
from gpuk8s.bundle.manifest import ManifestError
from gpuk8s.bundle.verify import verify

# a bundle is zstd-compressed by the zstd program; .ci/run installs it
pytestmark = pytest.mark.skipif(shutil.which("zstd") is None,
                                reason="the zstd program is not installed (apt-get install zstd)")

FILES = {"packages/ubuntu-22.04/x86_64/kubeadm_1.36.5-1.1_amd64.deb": b"deb " * 1000,
         "images/oci/index.json": b'{"schemaVersion": 2, "manifests": []}\n',
         "images/oci/blobs/sha256/" + "a" * 64: b"\x1f\x8b" + bytes(range(256)) * 40}


def manifest_doc(contents: dict[str, bytes] | None = None, **over: Any) -> dict[str, Any]:
    files = FILES if contents is None else contents
    doc = {"schema_version": 1, "kind": "gpuk8s-bundle", "created_by": "gpuk8s 0.1.0", "kubernetes": "1.36.5",
           "targets": [{"os": "ubuntu-22.04", "arch": "x86_64", "runtime": "containerd",
                        "kernels": ["5.15.0-105-generic"], "driver_branches": ["580"]}],
           "images": ["registry.k8s.io/kube-apiserver:v1.36.5"],
           "files": {p: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for p, b in files.items()}}
    doc.update(over)
    return doc


def write(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]], raw_tail: bytes = b"") -> Path:
    """A pax tar of `members` ((name, bytes) for a file, or a TarInfo as it is), zstd-compressed to `path`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                t.addfile(m, io.BytesIO(b"\0" * m.size) if m.isreg() else None)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                t.addfile(info, io.BytesIO(m[1]))
    data = buf.getvalue() + raw_tail
    subprocess.run(["zstd", "-q", "-f", "-o", str(path)], input=data, check=True)
    return path


def good(tmp_path: Path, contents: dict[str, bytes] | None = None, **over: Any) -> Path:
    files = FILES if contents is None else contents
    text = json.dumps(manifest_doc(files, **over)).encode()
    return write(tmp_path / "b.tar.zst", [(manifest.NAME, text), *files.items()])


def test_a_bundle_as_built_verifies(tmp_path: Path) -> None:
    v = verify(good(tmp_path))
    assert v.ok and v.files == 3 and v.bytes == sum(len(b) for b in FILES.values())
    assert v.manifest.minor == "1.36" and v.manifest.targets[0].kernels == ("5.15.0-105-generic",)
    assert manifest.parse(v.manifest.dumps()) == v.manifest  # written as read


def test_a_changed_missing_or_added_file_is_named(tmp_path: Path) -> None:
    text = json.dumps(manifest_doc()).encode()
    changed = {**FILES, "images/oci/index.json": b'{"schemaVersion": 2, "manifests": [1]}\n'}
    name = "images/oci/index.json"
    files = [(manifest.NAME, text), *[(p, b) for p, b in changed.items() if "kubeadm" not in p], ("extra.txt", b"x")]
    v = verify(write(tmp_path / "b.tar.zst", files))
    assert not v.ok
    assert any(p.startswith(f"{name}: ") and "bytes, the manifest says" in p for p in v.problems), v.problems
    assert "extra.txt: in the bundle, not in its manifest" in v.problems
    assert "packages/ubuntu-22.04/x86_64/kubeadm_1.36.5-1.1_amd64.deb: in the manifest, not in the bundle" in v.problems
    same_size = {**FILES, name: FILES[name].replace(b"[]", b"{}")}
    v = verify(write(tmp_path / "c.tar.zst", [(manifest.NAME, text), *same_size.items()]))
    assert v.problems == [f"{name}: sha256 {hashlib.sha256(same_size[name]).hexdigest()}, the manifest says "
                          f"{hashlib.sha256(FILES[name]).hexdigest()} (corrupted or changed)"]


def test_a_corrupted_or_truncated_file_is_refused_with_its_name(tmp_path: Path) -> None:
    path = good(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "flipped.tar.zst"
    bad.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=f"{bad}") as e:
        verify(bad)
    assert "corrupted" in e.value.message or "checksum" in e.value.message, e.value.message
    cut = tmp_path / "cut.tar.zst"
    cut.write_bytes(path.read_bytes()[: len(data) // 2])
    with pytest.raises(BundleError, match=f"{cut} is corrupted: zstd: "):
        verify(cut)
    plain = tmp_path / "plain.tar"
    plain.write_bytes(b"\0" * 1024)
    with pytest.raises(BundleError, match="is not a zstd-compressed file"):
        verify(plain)


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "") -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.type, i.size, i.linkname = kind, size, link
    return i


@pytest.mark.parametrize(("member", "says"), [
    (_info("../../etc/cron.d/x", size=4), "is not a plain relative path"),
    (_info("/etc/passwd", size=4), "is not a plain relative path"),
    (_info("images/./x", size=4), "is not a plain relative path"),
    (_info("a\\b", size=4), "is not a plain relative path"),
    (_info("images/x\x1b[31m", size=4), "is not a plain relative path"),
    (_info("images/link", tarfile.SYMTYPE, link="/etc/shadow"), "is a symbolic link"),
    (_info("images/hard", tarfile.LNKTYPE, link="manifest.json"), "is a hard link"),
    (_info("dev/sda", tarfile.BLKTYPE), "is a block device"),
    (_info("dev/null", tarfile.CHRTYPE), "is a character device"),
    (_info("fifo", tarfile.FIFOTYPE), "is a FIFO"),
])
def test_hostile_members_stop_the_read_before_anything_is_used(tmp_path: Path, member: tarfile.TarInfo,
                                                                says: str) -> None:
    text = json.dumps(manifest_doc({})).encode()
    with pytest.raises(BundleError, match=says):
        verify(write(tmp_path / "h.tar.zst", [(manifest.NAME, text), member]))


def test_size_bombs_and_counts_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = json.dumps(manifest_doc({})).encode()
    # a header that claims more than a member may be: refused before a byte of it is read
    huge = _info("images/big", size=archive.MAX_MEMBER + 1)
    info = tarfile.TarInfo(manifest.NAME)
    info.size = len(text)
    head = info.tobuf(tarfile.PAX_FORMAT) + text + b"\0" * (-len(text) % 512)  # then no end-of-archive blocks
    path = tmp_path / "bomb.tar.zst"
    subprocess.run(["zstd", "-q", "-f", "-o", str(path)], input=head + huge.tobuf(tarfile.PAX_FORMAT), check=True)
    with pytest.raises(BundleError, match="more than a bundle's member may be"):
        verify(path)
    # zeros compress to nothing: a small file that decompresses to more than the bundle may hold
    monkeypatch.setattr(archive, "MAX_TOTAL", 1 << 20)
    zeros = {f"z{i}": b"\0" * (300 << 10) for i in range(5)}
    small = good(tmp_path, zeros)
    assert small.stat().st_size < 20_000
    with pytest.raises(BundleError, match="more than 0 GiB in all"):
        verify(small)
    monkeypatch.setattr(archive, "MAX_MEMBERS", 3)
    with pytest.raises(BundleError, match="more than 3 members"):
        verify(good(tmp_path, {f"f{i}": b"x" for i in range(4)}))
    # a pax header bigger than any gpuk8s writes
    long = _info("images/p", size=0)
    long.pax_headers = {"comment": "x" * (archive.MAX_PAX + 10)}
    with pytest.raises(BundleError, match="a pax header of"):
        verify(write(tmp_path / "pax.tar.zst", [(manifest.NAME, text), long]))


def test_the_manifest_must_come_first_and_be_well_formed(tmp_path: Path) -> None:
    text = json.dumps(manifest_doc()).encode()
    with pytest.raises(BundleError, match="first member is not manifest.json"):
        verify(write(tmp_path / "a.tar.zst", [*FILES.items(), (manifest.NAME, text)]))
    with pytest.raises(BundleError, match="appears twice"):
        verify(write(tmp_path / "b.tar.zst", [(manifest.NAME, text), *FILES.items(), *FILES.items()]))
    with pytest.raises(BundleError, match="data after the end of its tar stream"):
        verify(write(tmp_path / "c.tar.zst", [(manifest.NAME, text), *FILES.items()], raw_tail=b"junk" * 100))


@pytest.mark.parametrize(("change", "says"), [
    ({"kind": "helm-chart"}, "not a gpuk8s bundle's manifest"),
    ({"schema_version": 2}, "this gpuk8s reads 1"),
    ({"kubernetes": "1.36"}, "kubernetes is missing or not valid"),
    ({"targets": []}, "targets must list 1 to"),
    ({"targets": [{"os": "ubuntu-22.04", "arch": "x86_64", "runtime": "containerd", "shell": "sh"}]},
     "targets[0].unknown key 'shell'"),
    ({"targets": [{"os": "Ubuntu 22.04", "arch": "x86_64", "runtime": "containerd"}]}, "targets[0].os"),
    ({"files": {"../x": {"sha256": "0" * 64, "size": 1}}}, "is not a plain relative path"),
    ({"files": {"x": {"sha256": "0" * 63, "size": 1}}}, "is not {sha256, size}"),
    ({"files": {"x": {"sha256": "0" * 64, "size": True}}}, "is not {sha256, size}"),
    ({"images": ["$(reboot)"]}, "images is not a list of valid values"),
    ({"extra": 1}, "unknown key 'extra'"),
])
def test_a_manifest_that_is_not_what_bundle_create_writes_is_refused(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ManifestError, match=says.replace("[", r"\[").replace("]", r"\]").replace("$", r"\$")
                       .replace("(", r"\(").replace(")", r"\)").replace("{", r"\{").replace("}", r"\}")):
        manifest.parse(json.dumps(manifest_doc(**change)))
    with pytest.raises(ManifestError, match="not JSON"):
        manifest.parse("[" * 100_000)


def test_the_command_says_whole_or_names_what_differs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpuk8s import cli

    cli._register_commands()
    path = good(tmp_path)
    r = CliRunner().invoke(cli.app, ["bundle", "verify", str(path), "-o", "json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["ok"] and doc["files"] == 3 and doc["kubernetes"] == "1.36.5", r.stdout
    text = json.dumps(manifest_doc()).encode()
    changed = write(tmp_path / "x.tar.zst", [(manifest.NAME, text), *[(p, b + b"!") for p, b in FILES.items()]])
    r = CliRunner().invoke(cli.app, ["bundle", "verify", str(changed)])
    assert r.exit_code == 1 and "bytes, the manifest says" in r.stdout and "do not install from this copy" in \
        r.stdout, r.stdout
    r = CliRunner().invoke(cli.app, ["bundle", "verify", str(tmp_path / "none.tar.zst"), "-o", "json"])
    assert r.exit_code == 1 and "No such file or directory" in json.loads(r.stdout)["error"]


# -- coverage: which hosts the bundle serves ------------------------------------------------------------------

COVER_INV = """
cluster: {kubernetes_version: "1.36"}
hosts:
  - {name: cp-1, address: 10.0.0.1, role: control-plane}
  - {name: gpu-1, address: 10.0.0.2, gpus: 8, driver: {manage: true, branch: "580"}}
  - {name: gpu-2, address: 10.0.0.3, gpus: 8, driver: {manage: true, branch: "595"}}
  - {name: gpu-3, address: 10.0.0.4, gpus: 8}
  - {name: al-1, address: 10.0.0.5, gpus: 8}
"""


def test_coverage_names_each_host_and_what_the_bundle_lacks_for_it() -> None:
    import dataclasses

    from gpuk8s.bundle.coverage import gaps
    from gpuk8s.facts.model import OSInfo
    from gpuk8s.inventory.loader import loads
    from tests.unit.test_checks import facts

    m = manifest.parse(json.dumps(manifest_doc()))
    inv = loads(COVER_INV)
    alinux = OSInfo("alinux", ("rhel", "fedora", "centos", "anolis"), "3", "Alibaba Cloud Linux 3", "rhel")
    seen = {"cp-1": facts(), "gpu-1": facts(), "gpu-2": facts(kernel="5.15.0-112-generic"),
            "gpu-3": facts(kernel="6.8.0-40-generic"), "al-1": dataclasses.replace(facts(), os=alinux)}
    got = [(g.host, g.what) for g in gaps(m, inv, seen)]
    # gpu-1: its branch and kernel are in the bundle; gpu-3 brings its own driver (any kernel will do)
    assert got == [("gpu-2", "driver-branch"), ("gpu-2", "kernel"), ("al-1", "target")], got
    msgs = {(g.host, g.what): g.message for g in gaps(m, inv, seen)}
    assert msgs["gpu-2", "kernel"] == ("gpu-2: kernel 5.15.0-112-generic: the bundle has no driver modules for it "
                                       "(it has them for 5.15.0-105-generic on ubuntu-22.04)")
    assert "alinux-3 x86_64 with containerd: the bundle has no packages for it" in msgs["al-1", "target"]
    # an unread host, and another Kubernetes version
    other = loads(COVER_INV.replace('"1.36"', '"1.37"'))
    got = [(g.host, g.what) for g in gaps(m, other, {**seen, "gpu-3": None})]
    assert got[0] == ("", "kubernetes") and ("gpu-3", "facts") in got
    assert [g.what for g in gaps(m, loads(COVER_INV.replace('"1.36"', '"1.36.4"')), seen)][0] == "kubernetes"
    # a bundle built for another CNI
    flannel = loads(COVER_INV.replace('kubernetes_version: "1.36"', 'kubernetes_version: "1.36", cni: flannel'))
    m = manifest.parse(json.dumps(manifest_doc({**FILES, "manifests/calico.yaml": b"kind: DaemonSet\n"})))
    assert not [g for g in gaps(m, inv, seen) if not g.host]
    assert [(g.what, g.message) for g in gaps(m, flannel, seen) if not g.host] == [
        ("cni", "the bundle holds no flannel manifest (the inventory's CNI): build the bundle with this inventory")]


def test_the_writer_makes_what_the_reader_takes_and_the_same_files_give_the_same_bytes(tmp_path: Path) -> None:
    from gpuk8s.bundle import writer

    src = tmp_path / "src"
    files = {}
    for name, data in FILES.items():
        p = src / name.replace("/", "_")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        files[name] = p
    base = manifest.parse(json.dumps(manifest_doc({})))
    m = writer.write(tmp_path / "one.tar.zst", base, files)
    assert m.files == manifest.parse(json.dumps(manifest_doc())).files  # every sha256 and size
    v = verify(tmp_path / "one.tar.zst")
    assert v.ok and v.manifest == m and v.files == 3
    for p in files.values():
        p.touch()  # another mtime: the bundle does not change
    writer.write(tmp_path / "two.tar.zst", base, dict(reversed(list(files.items()))))
    assert (tmp_path / "one.tar.zst").read_bytes() == (tmp_path / "two.tar.zst").read_bytes()
    with pytest.raises(BundleError, match="not a plain relative path"):
        writer.write(tmp_path / "three.tar.zst", base, {"../x": files[next(iter(files))]})


def test_the_sbom_is_spdx_2_3_as_its_published_schema_says() -> None:
    """The SPDX 2.3 JSON schema of spdx/spdx-spec (tests/fixtures/spdx/SOURCE.md) validates the document; every file of
    the bundle is a package with its sha256; a purl where one is known; the same manifest gives the same document."""
    import jsonschema

    from gpuk8s.bundle import sbom

    schema = json.loads((Path(__file__).parents[1] / "fixtures" / "spdx" / "spdx-2.3-schema.json").read_text())
    m = manifest.parse(json.dumps(manifest_doc()))
    deb = "packages/ubuntu-22.04/x86_64/kubeadm_1.36.5-1.1_amd64.deb"
    doc = sbom.spdx(m, "2026-12-04T12:00:00Z", {deb: "pkg:deb/ubuntu/kubeadm@1.36.5-1.1?arch=amd64"})
    jsonschema.validate(doc, schema)
    by_path = {p["packageFileName"]: p for p in doc["packages"]}
    assert set(by_path) == set(FILES)
    assert by_path[deb]["checksums"] == [{"algorithm": "SHA256",
                                          "checksumValue": hashlib.sha256(FILES[deb]).hexdigest()}]
    assert by_path[deb]["externalRefs"][0]["referenceLocator"] == "pkg:deb/ubuntu/kubeadm@1.36.5-1.1?arch=amd64"
    assert len({p["SPDXID"] for p in doc["packages"]}) == 3 and len(doc["relationships"]) == 3
    assert sbom.spdx(m, "2026-12-04T12:00:00Z", {deb: "pkg:deb/ubuntu/kubeadm@1.36.5-1.1?arch=amd64"}) == doc
    bad = {**doc, "packages": [{**doc["packages"][0], "checksums": [{"algorithm": "SHA-256", "checksumValue": "0"}]}]}
    with pytest.raises(jsonschema.ValidationError, match="is not one of"):
        jsonschema.validate(bad, schema)  # the schema is a real check


def test_a_signed_bundle_is_checked_against_the_builders_key(tmp_path: Path) -> None:
    """bundle create --sign-with KEY writes FILE.asc; bundle verify --key and install --bundle-key refuse a bundle
    without it, with a signature of another key, or changed after it was signed (the real gpg and gpgv)."""
    import tempfile

    from typer.testing import CliRunner

    from gpuk8s import cli
    from gpuk8s.bundle import signature

    cli._register_commands()
    app = cli.app
    home = Path(tempfile.mkdtemp(prefix="gk-sig-"))  # short: gpg-agent's socket lives in it
    try:
        env = {"GNUPGHOME": str(home)}
        for uid in ("builder <b@lab.example>", "someone else <x@lab.example>"):
            subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never"],
                           check=True, capture_output=True, env={**os.environ, **env})
        keys = {}
        for name, uid in (("builder", "b@lab.example"), ("other", "x@lab.example")):
            keys[name] = tmp_path / f"{name}.asc"
            keys[name].write_bytes(subprocess.run(["gpg", "--armor", "--export", uid], check=True, capture_output=True,
                                                  env={**os.environ, **env}).stdout)
        bundle = good(tmp_path)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("GNUPGHOME", str(home))
            signature.sign(bundle, "b@lab.example")
        assert signature.signature_path(bundle).read_text().startswith("-----BEGIN PGP SIGNATURE-----")
        assert len(signature.check(bundle, keys["builder"])) == 40  # the signer's fingerprint
        with pytest.raises(signature.SignatureError, match="not a good one by the key other.asc"):
            signature.check(bundle, keys["other"])
        r = CliRunner().invoke(app, ["bundle", "verify", str(bundle), "--key", str(keys["builder"])])
        assert r.exit_code == 0 and "signed by " in r.output, r.output
        r = CliRunner().invoke(app, ["bundle", "verify", str(bundle), "--key", str(keys["other"]), "-o", "json"])
        assert r.exit_code == 1 and "its signature is not a good one" in r.output, r.output
        # install refuses it before any host is contacted (TEST-NET addresses: nothing would answer anyway)
        inv = tmp_path / "inventory.yaml"
        inv.write_text("cluster: {kubernetes_version: '1.36'}\nhosts:\n  - {name: cp-1, address: 192.0.2.1, role: "
                       "control-plane}\n")
        r = CliRunner().invoke(app, ["install", "-i", str(inv), "--bundle", str(bundle), "--bundle-key",
                                     str(keys["other"]), "-o", "json"])
        assert r.exit_code == 1 and "its signature is not a good one" in r.output, r.output
        # changed after it was signed
        data = bytearray(bundle.read_bytes())
        data[-1] ^= 1
        bundle.write_bytes(bytes(data))
        with pytest.raises(signature.SignatureError, match="not a good one"):
            signature.check(bundle, keys["builder"])
        signature.signature_path(bundle).unlink()
        with pytest.raises(signature.SignatureError, match="no signature beside it"):
            signature.check(bundle, keys["builder"])
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def test_keep_serving_without_a_bundle_is_a_usage_error(tmp_path: Path) -> None:
    """--keep-serving alone says what is missing (exit 2), before any host is contacted."""
    from typer.testing import CliRunner

    from gpuk8s import cli

    cli._register_commands()
    inv = tmp_path / "inventory.yaml"
    inv.write_text("cluster: {kubernetes_version: '1.36'}\nhosts:\n  - {name: cp-1, address: 192.0.2.1, role: "
                   "control-plane}\n")
    for cmd in (["install"], ["join", "cp-1"], ["upgrade"], ["driver", "upgrade"]):
        r = CliRunner().invoke(cli.app, [*cmd, "-i", str(inv), "--keep-serving", "-o", "json"])
        assert r.exit_code == 2 and "--keep-serving without --bundle" in r.output, (cmd, r.output)
