"""Checks across hosts: consistency, uniqueness, clock skew. Pure functions of the facts."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from gpuk8s.facts.model import HostFacts
from gpuk8s.preflight.result import CheckResult, failed, passed, skipped


def _odd_ones(values: dict[str, str]) -> tuple[str, list[str]]:
    """The majority value, and the hosts that differ from it."""
    common, _ = Counter(values.values()).most_common(1)[0]
    return common, sorted(h for h, v in values.items() if v != common)


def _consistent(check_id: str, what: str, facts: dict[str, HostFacts], key: Callable[[HostFacts], str],
                remedy: str) -> CheckResult:
    values = {h: key(f) for h, f in facts.items()}
    if len(set(values.values())) <= 1:
        return passed(check_id, f"every host: {next(iter(values.values()), '-')}")
    common, odd = _odd_ones(values)
    detail = "; ".join(f"{h}: {values[h]}" for h in odd)
    return failed(check_id, f"{what} differs: most hosts have {common}, but {detail}", remedy)


def _unique(check_id: str, what: str, facts: dict[str, HostFacts], key: Callable[[HostFacts], list[str]],
            remedy: str) -> CheckResult:
    seen: dict[str, list[str]] = defaultdict(list)
    for host, f in facts.items():
        for v in set(key(f)):
            if v:
                seen[v].append(host)
    dups = {v: hs for v, hs in seen.items() if len(hs) > 1}
    if not seen:
        return skipped(check_id, f"no {what} could be read")
    if dups:
        detail = "; ".join(f"{v} on {', '.join(sorted(hs))}" for v, hs in sorted(dups.items()))
        return failed(check_id, f"duplicate {what}: {detail}", remedy)
    return passed(check_id, f"{len(seen)} distinct")


def check_cluster(facts: dict[str, HostFacts], unreachable: list[str], local_times: dict[str, float],
                  max_skew_s: float) -> list[CheckResult]:
    out: list[CheckResult] = []
    if unreachable:
        out.append(failed("cluster.reachable", f"{len(unreachable)} host(s) could not be checked: "
                          f"{', '.join(sorted(unreachable))}", "see each host's ssh.reachable result"))
    else:
        out.append(passed("cluster.reachable", f"all {len(facts)} host(s) answered"))
    if not facts:
        return out
    out.append(_consistent("cluster.os-consistent", "the OS", facts,
                           lambda f: f.os.pretty_name or f"{f.os.id} {f.os.version_id}",
                           "run the same OS release on every node"))
    out.append(_consistent("cluster.kernel-consistent", "the kernel", facts, lambda f: f.kernel,
                           "run the same kernel on every node (the NVIDIA driver is built per kernel)"))
    out.append(_consistent("cluster.arch-consistent", "the CPU architecture", facts, lambda f: f.arch,
                           "mixed architectures need multi-arch images for every workload"))
    out.append(_unique("cluster.unique-hostnames", "hostnames", facts, lambda f: [f.hostname],
                       "give every host its own hostname (hostnamectl set-hostname)"))
    out.append(_unique("cluster.unique-macs", "MAC addresses", facts, lambda f: list(f.macs),
                       "cloned VMs share MACs: regenerate them"))
    out.append(_unique("cluster.unique-product-uuid", "product_uuid", facts,
                       lambda f: [f.product_uuid or ""], "cloned VMs share product_uuid: regenerate it"))
    out.append(_unique("cluster.unique-machine-id", "/etc/machine-id", facts, lambda f: [f.machine_id or ""],
                       "cloned images share it: rm /etc/machine-id && systemd-machine-id-setup, then reboot"))
    skews = {h: facts[h].time - t for h, t in local_times.items()  # type: ignore[operator]
             if h in facts and facts[h].time is not None}
    if skews:
        worst = max(skews, key=lambda h: abs(skews[h]))
        if abs(skews[worst]) > max_skew_s:
            out.append(failed("cluster.clock-skew", f"{worst}'s clock is {skews[worst]:+.1f} s off this machine's "
                              f"(limit {max_skew_s:g} s)",
                              "enable time sync on every node (timedatectl set-ntp true, chrony)"))
        else:
            out.append(passed("cluster.clock-skew", f"largest skew {abs(skews[worst]):.2f} s ({worst})"))
    return out
