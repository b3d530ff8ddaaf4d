"""rpm's version order for bundles of Alibaba Cloud Linux 3 hosts (issue 44), checked against the real rpm on this
machine (`rpm.vercmp` in rpm's Lua, the library's rpmvercmp)."""

from __future__ import annotations

import functools
import shutil
import subprocess

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
