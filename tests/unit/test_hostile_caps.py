"""Issue 42's findings 2, 3, 6 and 7: a hostile host's text at the size gpuk8s really reads of it, parsed and judged
in CPU time linear in it, and every message short whatever the host lists.

The sizes are the real caps, imported, not restated: a probe answer (preflight, health, doctor) is read up to
PROBE_MAX_OUTPUT (8 MiB); a node's ResourceSlices come from the API server, where any node's kubelet may publish
slices naming itself. The times before the fixes (this 2-core machine): 40,000 kernel lines of distinct GPUs off the
bus 9.8 s; 16,000 GPUs owing a reset 20.4 s and a 1.23 MiB message; 1,500 slices of one node 16.4 s; 4,096 driver
packages against 4,096 holds 2.5 s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from time import process_time
from typing import Any, TypeVar

from gpuk8s.facts.health import MAX_FALLEN, health_facts, parse_kernel_log, parse_smi_query, read_health
from gpuk8s.facts.model import DriverFacts
from gpuk8s.health.checks import MAX_NAMED, judge
from gpuk8s.kube import dra
from gpuk8s.preflight import driver_checks
from gpuk8s.preflight.runner import PROBE_MAX_OUTPUT
from tests.unit.test_checks import facts
from tests.unit.test_health import HOST8

T = TypeVar("T")
CAP = PROBE_MAX_OUTPUT


def cpu(bound: float, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args), asserted to take less than `bound` seconds of CPU (wall time stretches on a loaded machine)."""
    t0 = process_time()
    out = fn(*args)
    took = process_time() - t0
    assert took < bound, f"{getattr(fn, '__name__', fn)} took {took:.2f} s of CPU"
    return out


def fill(line: Callable[[int], str], size: int = CAP) -> str:
    """Lines line(0), line(1), ... up to `size` characters."""
    out, n, i = [], 0, 0
    while True:
        s = line(i) + "\n"
        if n + len(s) > size:
            return "".join(out)
        out.append(s)
        n, i = n + len(s), i + 1


def bus(i: int) -> str:
    return f"{i >> 13:04x}:{(i >> 5) & 0xff:02x}:{i & 0x1f:02x}"


def test_a_kernel_log_of_distinct_gpus_off_the_bus_at_the_probe_cap_is_linear() -> None:
    # each form the driver writes: the 535 one-liner, Xid 79, the 570+ two-line text
    forms = (lambda i: f"kernel: NVRM: GPU {bus(i)}.0: GPU has fallen off the bus.",
             lambda i: f"NVRM: Xid (PCI:{bus(i)}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
             lambda i: f"NVRM: The NVIDIA GPU {bus(i)}.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\n"
                       "NVRM: fallen off the bus and is not responding to commands.")
    for form in forms:
        text = fill(form)
        assert len(text) > CAP - 300 and text.count("\n") > 40_000
        k = cpu(3.0, parse_kernel_log, text)
        assert len(k.fallen) == MAX_FALLEN and k.fallen[0] == bus(0)
        # the whole path health takes: the probe's framing, the judge
        framed = f"@@gpuk8s-begin health-kernel\n{text}@@gpuk8s-end health-kernel 0\n"
        h = cpu(4.0, read_health, framed)
        got = {f.id: f for f in cpu(1.0, judge, HOST8, facts(), h)}
        assert got["health.xid"].status == "fail" and len(got["health.xid"].message) < 8192


def test_gpus_owing_a_reset_at_the_probe_cap_are_judged_linearly_and_named_briefly() -> None:
    block = ("GPU {}.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n"
             "    GPU Reset Status\n        Reset Required                    : Yes\n"
             "        Drain and Reset Recommended       : No\n")
    text = fill(lambda i: block.format(f"0000{bus(i)}").rstrip("\n"))
    assert len(text) > CAP - 300
    gpus = cpu(6.0, parse_smi_query, text)
    assert len(gpus) > 16_000 and all(g.reset_required for g in gpus)
    h = health_facts((0, text), (0, ""), (0, ""))
    got = {f.id: f for f in cpu(1.0, judge, replace(HOST8, gpus=None), facts(), h)}
    xid = got["health.xid"]
    assert xid.status == "fail" and len(xid.message) < 2048
    assert f"and {len(gpus) - MAX_NAMED} more report GPU Reset Required" in xid.message
    assert xid.message.count("GPU ") == MAX_NAMED + 1  # the names, and "GPU Reset Required"


def test_thousands_of_slices_naming_one_node_are_read_linearly_and_capped() -> None:
    def piece(n: int) -> dict[str, Any]:
        return {"spec": {"driver": dra.DRA_DRIVER, "nodeName": "gpu-1", "pool": {"name": "gpu-1", "generation": 1},
                         "devices": [{"name": f"gpu-{n}-{d}", "attributes": {"type": {"string": "gpu"}}}
                                     for d in range(128)]}}
    slices = [piece(n) for n in range(1500)] + [{"spec": {"driver": dra.DRA_DRIVER, "nodeName": "gpu-2",
                                                          "pool": {"name": "gpu-2"}, "devices": [{"name": "gpu-0"}]}}]
    got = cpu(1.0, dra.published, slices)
    assert len(got["gpu-1"].devices) == dra.MAX_NODE_DEVICES and [d.name for d in got["gpu-2"].devices] == ["gpu-0"]
    # the same device in every slice: one device
    same = [{"spec": {**s["spec"], "devices": [{"name": "gpu-0"}] * 128}} for s in slices[:1500]]
    assert [d.name for d in cpu(1.0, dra.published, same)["gpu-1"].devices] == ["gpu-0"]


def test_thousands_of_driver_packages_against_thousands_of_holds_are_sets() -> None:
    pkgs = tuple((f"nvidia-utils-{i}", "580.95.05-0ubuntu1") for i in range(4096))
    holds = tuple(f"nvidia-utils-{i}-3:580.95.05-1.el8.*" for i in range(1, 4097))  # one short: 0 is not held
    d = DriverFacts(packages=pkgs, held=holds)
    r = cpu(0.5, driver_checks._held, d, facts(), False)
    assert r.status == "warn" and "driver packages not held: nvidia-utils-0:" in r.message
    # the prefix rule as before: a hold naming the package and its version holds it, a longer name does not
    assert driver_checks.held_names(["nvidia-open-3:580.95.05-1.el8.*", "nvidia-utils-580x"],
                                    ["nvidia-open", "nvidia-utils-580", "nvidia-utils-580x"]) == \
        {"nvidia-open", "nvidia-utils-580x"}
