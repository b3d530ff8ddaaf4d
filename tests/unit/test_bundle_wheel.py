"""gpuk8s/bundle/wheel.py on a distribution installed by hand as pip lays one out (its RECORD with each file's
sha256): the wheel rebuilt holds its files and its .dist-info with RECORD anew, leaves out bytecode, pip's own
files and what lies outside the install root, is the same bytes twice, and the real pip installs it; a file
changed after the install and an editable install are refused. tests/packaging rebuilds the real gpuk8s from its
installed wheel (the same files) and installs it with its dependencies offline."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpuk8s.bundle import wheel


def _record_line(root: Path, rel: str) -> str:
    data = (root / rel).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def installed(root: Path, editable: bool = False, name: str = "demo_pkg", requires: tuple[str, ...] = ()
              ) -> md.Distribution:
    """NAME 1.0 as pip installs it under `root` (site-packages), with a console script in ../../bin."""
    dash = name.replace("_", "-")
    (root / name / "__pycache__").mkdir(parents=True)
    (root / name / "__init__.py").write_text("VALUE = 1\n")
    (root / name / "data.txt").write_text("data\n")
    (root / name / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\x00bytecode")
    (root.parent / "bin").mkdir(parents=True, exist_ok=True)
    (root.parent / "bin" / dash).write_text("#!/usr/bin/python\n")
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dash}\nVersion: 1.0\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    (info / "entry_points.txt").write_text(f"[console_scripts]\n{dash} = {name}:main\n")
    (info / "INSTALLER").write_text("pip\n")
    if editable:
        (info / "direct_url.json").write_text('{"url": "file:///src", "dir_info": {"editable": true}}')
    rels = [f"{name}/__init__.py", f"{name}/data.txt", f"{name}/__pycache__/__init__.cpython-311.pyc",
            f"{name}-1.0.dist-info/METADATA", f"{name}-1.0.dist-info/WHEEL",
            f"{name}-1.0.dist-info/entry_points.txt", f"{name}-1.0.dist-info/INSTALLER"]
    lines = [_record_line(root, r) for r in rels] + [_record_line(root, f"../bin/{dash}").replace(
        f"../bin/{dash}", f"../../bin/{dash}", 1), f"{name}-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return md.PathDistribution(info)


def test_an_installed_distribution_becomes_its_wheel_again(tmp_path: Path) -> None:
    dist = installed(tmp_path / "lib" / "site-packages")
    a = wheel.rebuild(dist, tmp_path / "a")
    b = wheel.rebuild(dist, tmp_path / "b")
    assert a.name == "demo_pkg-1.0-py3-none-any.whl"
    assert a.read_bytes() == b.read_bytes()  # reproducible
    with zipfile.ZipFile(a) as z:
        names = z.namelist()
        assert names == ["demo_pkg/__init__.py", "demo_pkg/data.txt", "demo_pkg-1.0.dist-info/METADATA",
                         "demo_pkg-1.0.dist-info/WHEEL", "demo_pkg-1.0.dist-info/entry_points.txt",
                         "demo_pkg-1.0.dist-info/RECORD"]  # no bytecode, INSTALLER or script; .dist-info last
        record = z.read("demo_pkg-1.0.dist-info/RECORD").decode().splitlines()
        for line in record[:-1]:
            path, digest, size = line.split(",")
            data = z.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
                b"=").decode() and int(size) == len(data)
        assert record[-1] == "demo_pkg-1.0.dist-info/RECORD,,"
    # the real pip takes it
    target = tmp_path / "target"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(target), str(a)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "demo_pkg" / "data.txt").read_text() == "data\n"


def test_a_changed_file_and_an_editable_install_are_refused(tmp_path: Path) -> None:
    dist = installed(tmp_path / "one" / "site-packages")
    (tmp_path / "one" / "site-packages" / "demo_pkg" / "data.txt").write_text("changed\n")
    with pytest.raises(wheel.WheelError, match="data.txt is not the file pip installed"):
        wheel.rebuild(dist, tmp_path / "out")
    dist = installed(tmp_path / "two" / "site-packages", editable=True)
    with pytest.raises(wheel.WheelError, match="installed editable"):
        wheel.rebuild(dist, tmp_path / "out")


def test_without_gpuk8s_own_wheel_nothing_is_carried(tmp_path: Path) -> None:
    """The checkout the tests run from is an editable install: no wheel of gpuk8s, so none of its dependencies
    either (they are carried for its sake), and the reason is said."""
    got = wheel.wheels(tmp_path)
    assert got.built == {} and len(got.missing) == 1 and got.missing[0].startswith("gpuk8s: "), got


def test_a_record_path_that_leaves_its_root_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "lib" / "site-packages"
    dist = installed(site)
    record = site / "demo_pkg-1.0.dist-info" / "RECORD"
    record.write_text(record.read_text() + "demo_pkg/../../../etc/passwd,sha256=x,1\n")
    with pytest.raises(wheel.WheelError, match="not a plain path under its root"):
        wheel.rebuild(dist, tmp_path / "out")


def test_what_a_distribution_requires_is_carried_with_the_extras_asked_of_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """top requires mid[fast]; mid requires low only with its extra fast (and never unused): every wheel of the
    closure, and no other; a requirement not installed here is named."""
    site = tmp_path / "lib" / "site-packages"
    installed(site, name="top_pkg", requires=("mid-pkg[fast]>=1", "gone-pkg; python_version < '3'"))
    installed(site, name="mid_pkg", requires=("low-pkg; extra == 'fast'", "unused-pkg; extra == 'slow'"))
    installed(site, name="low_pkg", requires=("absent-pkg",))
    monkeypatch.syspath_prepend(str(site))
    got = wheel.wheels(tmp_path / "out", root="top-pkg")
    assert sorted(got.built) == ["wheel/low_pkg-1.0-py3-none-any.whl", "wheel/mid_pkg-1.0-py3-none-any.whl",
                                 "wheel/top_pkg-1.0-py3-none-any.whl"], got
    assert got.missing == ["absent-pkg: not installed here"], got
