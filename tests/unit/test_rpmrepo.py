"""rpm's version order for bundles of Alibaba Cloud Linux 3 hosts (issue 44), checked against the real rpm on this
machine (`rpm.vercmp` in rpm's Lua, the library's rpmvercmp)."""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.bundle import rpmrepo

VERSIONS = ["1.0", "1.0~rc1", "1.0~rc2", "1.0~~", "1.0^", "1.0^git1", "1.0^git1~pre", "1.0.1", "1.0a", "1.0.a",
            "1.00", "1.01", "1.1", "1.10", "1.9", "2.2.6", "2.2.10", "1.30.2", "1.30.10", "1.17.8", "535.274.02",
            "580.95.05", "a", "b", "A", "1_0", "1..0", "10", "9", "1.0.0.0", "2.0rc1", "2.0.rc1", "5.15.0"]
RPM = shutil.which("rpm")
# the order is checked against the real rpm; .ci/run installs it
NO_RPM = "rpm is not installed (apt-get install rpm)"


def _rpm(a: str, b: str) -> int:
    code = f"%{{lua: print(rpm.vercmp('{a}', '{b}'))}}"
    return int(subprocess.run([RPM or "rpm", "--eval", code], capture_output=True, text=True, check=True).stdout)


@pytest.mark.skipif(RPM is None, reason=NO_RPM)
def test_the_version_order_is_rpms() -> None:
    """Sorted by gpuk8s's order, each neighbouring pair is ordered so by the real rpm too (rpm's order being total
    on these, that is agreement on every pair)."""
    ordered = sorted(VERSIONS, key=functools.cmp_to_key(rpmrepo.vercmp))
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert _rpm(a, b) == rpmrepo.vercmp(a, b) != 1, (a, b)


@pytest.mark.skipif(RPM is None, reason=NO_RPM)
@settings(max_examples=40, deadline=None)
@given(st.text("0123456789.~^_ab", min_size=1, max_size=8), st.text("0123456789.~^_ab", min_size=1, max_size=8))
def test_any_two_versions_order_as_rpm_orders_them(a: str, b: str) -> None:
    assert rpmrepo.vercmp(a, b) == _rpm(a, b), (a, b)


def test_epoch_version_release() -> None:
    assert rpmrepo.evr("1:2.2.6-3.1.el8") == (1, "2.2.6", "3.1.el8")
    assert rpmrepo.compare("1:1.0-1", "2.0-1") == 1  # the epoch first
    assert rpmrepo.compare("1.30.2-150500.1.1", "1.30.10-150500.1.1") == -1
    assert rpmrepo.compare("2.2.6", "2.2.6-3.1.el8") == 0  # a requirement without a release
    with pytest.raises(rpmrepo.RpmError):
        rpmrepo.evr("x:1.0")


# -- repository metadata ------------------------------------------------------------------------------------------

REPOS = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "repos"


def test_primary_xml_as_createrepo_writes_it() -> None:
    from gpuk8s.bundle import rpmrepo

    pkgs = rpmrepo.parse_primary((REPOS / "rpm-primary-createrepo-testrepo-fake_bash-super_kernel.xml").read_bytes())
    by = {p.name: p for p in pkgs}
    assert set(by) == {"fake_bash", "super_kernel"}
    bash = by["fake_bash"]
    assert (bash.arch, bash.evr, bash.href, bash.size) == ("x86_64", "1.1.1-1", "fake_bash-1.1.1-1.x86_64.rpm", 2237)
    assert bash.sha256 == "90f61e546938a11449b710160ad294618a5bd3062e46f8cf851fd0088af184b7"
    assert rpmrepo.Dep("bash") in bash.provides and bash.requires == (rpmrepo.Dep("super_kernel"),)
    assert bash.files == ("/usr/bin/fake_bash",)
    idx = rpmrepo.RpmIndex(pkgs, "x86_64")
    # a virtual name (bash) and a file met by their providers; what the package requires comes with it
    assert [p.name for p in idx.candidates(rpmrepo.Dep("bash"))] == ["fake_bash"]
    assert [p.name for p in idx.candidates(rpmrepo.Dep("/usr/bin/fake_bash"))] == ["fake_bash"]
    res = rpmrepo.resolve(idx, [bash])
    assert sorted(res.chosen) == ["fake_bash", "super_kernel"], res
    # versioned provides: super_kernel = 6.0.1-2 satisfies >= 6.0, not > 6.0.1-2
    assert idx.candidates(rpmrepo.Dep("super_kernel", ">=", "6.0"))
    assert not idx.candidates(rpmrepo.Dep("super_kernel", ">", "6.0.1-2"))


def test_resolution_picks_the_newest_and_names_what_the_distribution_serves() -> None:
    from gpuk8s.bundle import rpmrepo

    pkgs = rpmrepo.parse_primary((REPOS / "rpm-primary-fedora-dwm-fc27-fc28.xml").read_bytes())
    idx = rpmrepo.RpmIndex(pkgs, "x86_64")
    newest = idx.candidates(rpmrepo.Dep("dwm"))[0]
    assert newest.evr == "6.1-7.fc28"
    res = rpmrepo.resolve(idx, [newest])
    assert list(res.chosen) == ["dwm"]
    # libX11 and the others are the distribution's; rtld(GNU_HASH) too; rpmlib() is rpm's own
    assert any(m.startswith("libX11.so.6()(64bit) (needed by dwm-6.1-7.fc28)") for m in res.missing), res.missing


_EXTERNAL = b"<!DOCTYPE x [<!ENTITY a SYSTEM 'file:///etc/passwd'>]><metadata>&a;</metadata>"
_LAUGHS = (b"<?xml version='1.0'?><!DOCTYPE l [<!ENTITY a 'aaaaaaaaaa'><!ENTITY b '&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;'>"
           b"<!ENTITY c '&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;'><!ENTITY d '&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;'>]>"
           b"<metadata><x>&d;&d;&d;&d;</x></metadata>")


@pytest.mark.parametrize("bad", [b"<metadata", _EXTERNAL, _LAUGHS])
def test_hostile_primary_xml_is_refused_or_read_without_expansion(bad: bytes) -> None:
    """Malformed XML, an external entity (never read), nested entities: refused, or no package read."""
    from gpuk8s.bundle import rpmrepo

    with contextlib.suppress(rpmrepo.RpmError):
        assert rpmrepo.parse_primary(bad) == []
