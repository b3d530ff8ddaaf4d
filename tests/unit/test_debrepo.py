"""Debian repository metadata for bundles (issue 44): dpkg's version order checked against the real dpkg on this
machine, the Packages format, and resolution (relations, alternatives, Provides, what the host has)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.bundle import debrepo
from gpuk8s.bundle.debrepo import Rel, RepoError

# the order is checked against the real dpkg; .ci/run installs it
NO_DPKG = "dpkg is not installed (apt-get install dpkg)"

VERSIONS = ["1.0", "1.0~rc1", "1.0~~", "1.0~", "1.0-1", "1.0-1ubuntu1", "1.0-1~bpo1", "1:0.1", "2.0", "0:2.0",
            "1.30.2-1.1", "1.30.10-1.1", "1.30.2-150500.1.1", "2.2.6-1", "2.2.6~ubuntu.22.04~jammy",
            "2.2.6-1~ubuntu.22.04~jammy", "1.17.8-1", "1.17.8-1ubuntu1", "535.274.02-0ubuntu0.22.04.1",
            "535.274.02-0ubuntu0.22.04.10", "5.15.0-105.115", "a", "A", "1.0+dfsg", "1.0.dfsg", "1.0a", "1.0+",
            "0", "00", "1.2.3.4.5", "10", "9", "1.0-0"]


def _dpkg(a: str, op: str, b: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", a, op, b], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("dpkg") is None, reason=NO_DPKG)
def test_the_version_order_is_dpkgs() -> None:
    """A list of real-looking versions sorted by gpuk8s's order: the real dpkg --compare-versions agrees on each
    neighbouring pair (less, or equal where gpuk8s says equal), which, dpkg's order being total, is agreement on
    every pair."""
    import functools

    for v in VERSIONS:  # each one dpkg accepts
        assert _dpkg(v, "eq", v), v
    ordered = sorted(VERSIONS, key=functools.cmp_to_key(debrepo.compare))
    for a, b in zip(ordered, ordered[1:], strict=False):
        if debrepo.compare(a, b) == 0:
            assert _dpkg(a, "eq", b), (a, b)
        else:
            assert _dpkg(a, "lt", b), (a, b)


@pytest.mark.skipif(shutil.which("dpkg") is None, reason=NO_DPKG)
@settings(max_examples=40, deadline=None)
@given(st.text("0123456789.~+-:ab", min_size=1, max_size=8), st.text("0123456789.~+-:ab", min_size=1, max_size=8))
def test_any_two_versions_dpkg_accepts_order_as_dpkg_orders_them(a: str, b: str) -> None:
    r = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], capture_output=True, text=True)
    if "warning" in r.stderr or "error" in r.stderr or r.returncode > 1:
        return  # a version dpkg itself calls malformed
    lt = r.returncode == 0
    assert (debrepo.compare(a, b) < 0) == lt, (a, b)


INDEX = """Package: kubeadm
Version: 1.30.2-1.1
Architecture: amd64
Depends: cri-tools (>= 1.30.0), kubernetes-cni (>= 1.2.0)
Filename: amd64/kubeadm_1.30.2-1.1_amd64.deb
Size: 10331940
SHA256: 0000000000000000000000000000000000000000000000000000000000000001

Package: kubeadm
Version: 1.30.10-1.1
Architecture: amd64
Depends: cri-tools (>= 1.30.0), kubernetes-cni (>= 1.2.0)
Filename: amd64/kubeadm_1.30.10-1.1_amd64.deb
Size: 10331950

Package: cri-tools
Version: 1.30.1-1.1
Architecture: amd64

Package: kubernetes-cni
Version: 1.4.0-1.1
Architecture: amd64
Depends: iptables | nftables,
 libc6:any (>= 2.34)

Package: nftables
Version: 1.0.2-1ubuntu3
Architecture: amd64
Provides: firewall-backend (= 1.0)

Package: docs
Version: 1
Architecture: all
Depends: missing-thing (>= 3)
"""


def test_resolution_takes_the_newest_that_satisfies_and_what_the_host_lacks() -> None:
    idx = debrepo.Index(debrepo.parse(INDEX), "amd64")
    r = debrepo.resolve(idx, [Rel("kubeadm")], installed={"libc6": "2.35-0ubuntu3.8"})
    assert {n: p.version for n, p in r.chosen.items()} == {
        "kubeadm": "1.30.10-1.1", "cri-tools": "1.30.1-1.1", "kubernetes-cni": "1.4.0-1.1",
        "nftables": "1.0.2-1ubuntu3"}
    assert r.missing == []
    # a pinned version; iptables on the host meets the alternative
    r = debrepo.resolve(idx, [Rel("kubeadm", "=", "1.30.2-1.1")], installed={"libc6": "2.35", "iptables": "1.8.7"})
    assert r.chosen["kubeadm"].sha256.endswith("1") and "nftables" not in r.chosen
    # what nothing satisfies is named with who needs it
    r = debrepo.resolve(idx, [Rel("docs"), Rel("kubeadm", ">=", "1.31")], installed={"libc6": "2.35"})
    assert r.missing == ["kubeadm (>= 1.31) (asked for): not in the index",
                         "missing-thing (>= 3) (needed by docs 1): not in the index"]
    # an old libc6 on the host: the index has none, so it is named
    r = debrepo.resolve(idx, [Rel("kubernetes-cni")], installed={"libc6": "2.31", "iptables": "1.8"})
    assert r.missing == ["libc6 (>= 2.34) (needed by kubernetes-cni 1.4.0-1.1): not in the index"]
    # a virtual package through a versioned Provides
    assert [p.name for p in idx.candidates(Rel("firewall-backend", ">=", "1.0"))] == ["nftables"]


@pytest.mark.parametrize("bad", ["Package kubeadm\n", " continuation\n", "Package: a\nVersion: 1\nDepends: a (>= \n",
                                 "Package: a\nVersion: 1\nDepends: $(reboot)\n"])
def test_text_that_is_not_a_packages_index_is_refused(bad: str) -> None:
    with pytest.raises(RepoError):
        debrepo.parse(bad)


REPOS = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "real" / "repos"


def test_resolution_against_debian_bookworms_real_index_of_a_nodes_host_tools() -> None:
    """A real Packages index (31 whole stanzas of Debian 12's main, amd64; the .meta sidecar gives the index's signed
    sha256): what kubeadm's host tools need, with epochs, a versioned Provides and the netfilter libraries."""
    idx = debrepo.Index(debrepo.parse((REPOS / "deb-packages-debian-bookworm-kubelet-host-deps.txt").read_text()),
                        "amd64")
    tools = [Rel(n) for n in ("conntrack", "ebtables", "socat", "iptables", "ethtool")]
    r = debrepo.resolve(idx, tools)
    got = {n: p.version for n, p in r.chosen.items()}
    assert got["conntrack"] == "1:1.4.7-1+b2" and got["iptables"] == "1.8.9-2" and got["libc6"] == "2.36-9+deb12u14"
    assert {"libnftnl11", "libnetfilter-conntrack3", "libxtables12", "libip4tc2", "libmnl0"} <= set(got)
    assert all(p.sha256 and p.filename.startswith("pool/main/") for p in r.chosen.values())
    # the excerpt holds no libtirpc3: named, with the package that needs it
    assert r.missing == ["libtirpc3 (>= 1.0.2) (needed by libnsl2 1.3.0-2): not in the index"]
    # a host that has libc6 and libtirpc3 already: neither is carried, nothing is missing
    r = debrepo.resolve(idx, tools, installed={"libc6": "2.36-9+deb12u14", "libtirpc3": "1.3.3+ds-1"})
    assert "libc6" not in r.chosen and r.missing == []
    # a host whose libc6 is older than what iptables needs gets the index's
    r = debrepo.resolve(idx, tools, installed={"libc6": "2.31-13", "libtirpc3": "1.3.3+ds-1"})
    assert r.chosen["libc6"].version == "2.36-9+deb12u14"


def test_the_real_pkgs_k8s_index_reads_with_its_comma_only_separators() -> None:
    pk = debrepo.parse((REPOS / "deb-packages-pkgs-k8s-kubeadm-1.27-multiarch.txt").read_text())
    kubeadm = [p for p in pk if p.name == "kubeadm" and p.arch == "amd64"]
    assert sorted(p.version for p in kubeadm) == ["1.27.0-2.1", "1.27.1-1.1"]
    assert any(g[0].name == "kubelet" and g[0].op == ">=" for g in kubeadm[0].depends)
