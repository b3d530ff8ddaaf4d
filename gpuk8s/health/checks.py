"""What `gpuk8s health` concludes from a host's facts (pure): one finding per check, ids in gpuk8s/findings.py.

The quick level's checks, each with its source and threshold (docs/health.md):
- health.gpu-count: the GPUs nvidia-smi lists against the inventory's `gpus:` and against the NVIDIA GPUs lspci
  sees (a GPU on the bus the driver does not list has fallen off it or failed to initialise).
- health.xid / health.xid-app: the kernel's Xid events since boot, judged by NVIDIA's Xid catalogue
  (gpuk8s/driver/xid.py): an Xid whose immediate action is a GPU reset or a reboot fails the host; an application's
  Xid (13, 31, 94, ...) or an informational one is a warning. A GPU that fell off the bus is a failure with or
  without its Xid 79 line.
- health.ecc-uncorrected: uncorrectable ECC errors since the driver loaded (volatile counters): any is a failure.
- health.retired-pages-pending: a page retirement waiting for a reboot (before Ampere).
- health.row-remap-pending: a row remap waiting for a GPU reset (Ampere and newer); health.row-remap-failed: the
  GPU ran out of spare rows (NVIDIA: the GPU needs to be replaced).
- health.pcie-width: the PCIe link narrower than the GPU and slot can do (the generation drops at idle to save
  power, so it is not judged here; the width does not).
- health.nvlink-down: an NVLink link `<inactive>`.
- health.clocks-slowdown: the hardware is slowing the GPU's clocks (thermal, power brake).
- health.fabric: on NVSwitch systems the GPU's fabric state is not Completed/Success.
"""

from __future__ import annotations

from gpuk8s.driver.xid import lookup
from gpuk8s.facts.health import HealthFacts
from gpuk8s.facts.model import HostFacts
from gpuk8s.findings import Finding, failed, passed, skipped
from gpuk8s.inventory.model import Host

QUICK = ("health.gpu-count", "health.xid", "health.xid-app", "health.ecc-uncorrected", "health.retired-pages-pending",
         "health.row-remap-pending", "health.row-remap-failed", "health.pcie-width", "health.nvlink-down",
         "health.clocks-slowdown", "health.fabric")


def _gpu_names(h: HealthFacts, buses: list[str]) -> str:
    index = {g.bus: i for i, g in enumerate(h.gpus)}
    return ", ".join(f"GPU {index[b]} ({b})" if b in index else b for b in buses)


def judge(host: Host, facts: HostFacts, h: HealthFacts) -> list[Finding]:
    """The quick level's findings for one host, in QUICK's order; a check the host cannot answer is skipped with
    the reason (no driver, nvidia-smi failed, no kernel log)."""
    g = facts.gpu
    if g.state != "ok":
        why = "no NVIDIA driver" if g.state == "absent" else f"nvidia-smi failed: {g.error}"
        # a failing driver is health's business too: it is what a GPU off the bus or a hung GPU looks like
        out = [failed("health.gpu-count", f"{why}: no GPU can be checked",
                      "fix the driver first (gpuk8s preflight names the cause: gpu.driver, driver.*)")]
        return out + _kernel(h) + [skipped(i, why) for i in QUICK[3:]]
    out = [_count(host, facts, h)]
    out += _kernel(h)
    if not h.smi_read:
        why = f"nvidia-smi -q failed: {h.smi_error}" if h.smi_error else "nvidia-smi -q not read"
        return out + [skipped(i, why) for i in QUICK[3:]]
    out += _memory(h)
    out.append(_pcie(h))
    out.append(_nvlink(h))
    out.append(_clocks(h))
    out.append(_fabric(facts, h))
    return out


def _count(host: Host, facts: HostFacts, h: HealthFacts) -> Finding:
    listed = len(facts.gpu.gpus)
    on_bus = len(facts.driver.pci_gpus) if facts.driver.lspci else None
    said = f"nvidia-smi lists {listed} GPU(s)" + (f", lspci {on_bus}" if on_bus is not None else "")
    want = host.gpus
    if want is not None and want != listed:
        return failed("health.gpu-count", f"the inventory expects {want} GPU(s): {said}",
                      "a GPU missing from nvidia-smi has fallen off the bus or failed to initialise (see health.xid "
                      "and the kernel log); reboot, reseat or replace it, or fix gpus: in the inventory",
                      evidence=[f"fell off the bus: {_gpu_names(h, list(h.kernel.fallen))}"] if h.kernel.fallen
                      else ())
    if on_bus is not None and on_bus > listed:
        return failed("health.gpu-count", f"{said}: {on_bus - listed} GPU(s) on the PCI bus that the driver does "
                      "not list", "check the kernel log for the GPU (fallen off the bus, probe failed); reboot, "
                      "reseat or replace it")
    return passed("health.gpu-count", said + (" (as the inventory expects)" if want is not None else ""))


def _kernel(h: HealthFacts) -> list[Finding]:
    if not h.kernel_read:
        why = f"the kernel log could not be read: {h.kernel_error}" if h.kernel_error else "the kernel log not read"
        return [skipped("health.xid", why), skipped("health.xid-app", why)]
    fatal: dict[int, list[str]] = {}
    other: dict[int, list[str]] = {}
    for e in h.kernel.xids:
        (fatal if lookup(e.xid).fatal else other).setdefault(e.xid, []).append(e.bus)
    lines = [e.line for e in h.kernel.xids]
    fallen = [b for b in h.kernel.fallen if 79 not in fatal or b not in fatal[79]]
    out: list[Finding] = []
    if fatal or fallen:
        parts = [f"Xid {n} ({lookup(n).meaning}) on {_gpu_names(h, sorted(set(buses)))}" for n, buses in
                 sorted(fatal.items())]
        parts += [f"GPU {b} fell off the bus (no Xid line)" for b in fallen]
        first = min(fatal) if fatal else 79
        ev = [ln for ln in lines if lookup(_xid_of(ln)).fatal][:8] or [f"fell off the bus: {b}" for b in fallen]
        out.append(failed("health.xid", "since boot: " + "; ".join(parts), lookup(first).remedy, evidence=ev))
    else:
        out.append(passed("health.xid", "no Xid that needs a GPU reset or a reboot since boot"))
    if other:
        parts = [f"Xid {n} ({lookup(n).meaning}) x{len(b)}" for n, b in sorted(other.items())]
        more = f" (and {h.kernel.more} more Xid lines)" if h.kernel.more else ""
        out.append(failed("health.xid-app", "since boot: " + ", ".join(parts) + more, lookup(min(other)).remedy,
                          evidence=[ln for ln in lines if not lookup(_xid_of(ln)).fatal][:8]))
    else:
        out.append(passed("health.xid-app", "no other Xid since boot"))
    return out


def _xid_of(line: str) -> int:
    # the evidence line 'NVRM: Xid (PCI:...): N, ...' back to N (lines are those parse_kernel_log matched)
    head = line.partition("): ")[2].split(",", 1)[0]
    return int(head) if head.isdecimal() else -1


def _memory(h: HealthFacts) -> list[Finding]:
    out = []
    bad = [(i, g) for i, g in enumerate(h.gpus) if g.uncorrected_volatile]
    if bad:
        out.append(failed("health.ecc-uncorrected", "uncorrectable ECC errors since the driver loaded: " +
                          ", ".join(f"GPU {i} ({g.bus}): {g.uncorrected_volatile}" for i, g in bad),
                          "drain the node and reset the GPU or reboot; on Ampere and newer see whether a row remap "
                          "is pending (health.row-remap-pending); RMA when it repeats"))
    elif not any(g.uncorrected_volatile is not None for g in h.gpus):
        out.append(skipped("health.ecc-uncorrected", "no GPU reports ECC error counts (ECC off or not supported)"))
    else:
        out.append(passed("health.ecc-uncorrected", "no uncorrectable ECC error since the driver loaded"))
    pend = [f"GPU {i} ({g.bus})" for i, g in enumerate(h.gpus) if g.retired_pending]
    if pend:
        out.append(failed("health.retired-pages-pending", "page retirement pending on " + ", ".join(pend),
                          "drain the node and reboot it: the retired pages are applied when the driver reloads"))
    elif not any(g.retired_pending is not None for g in h.gpus):
        out.append(skipped("health.retired-pages-pending", "no GPU uses page retirement (Ampere and newer remap rows)"))
    else:
        out.append(passed("health.retired-pages-pending", "no page retirement pending"))
    pend = [f"GPU {i} ({g.bus})" for i, g in enumerate(h.gpus) if g.remap_pending]
    fail = [f"GPU {i} ({g.bus})" for i, g in enumerate(h.gpus) if g.remap_failed]
    known = any(g.remap_pending is not None for g in h.gpus)
    if pend:
        out.append(failed("health.row-remap-pending", "row remapping pending on " + ", ".join(pend),
                          "drain the node and reset the GPU (nvidia-smi -r -i N) or reboot: the remap takes effect "
                          "then; until it does, the bad row can fail jobs again"))
    elif not known:
        out.append(skipped("health.row-remap-pending", "no GPU supports row remapping (before Ampere, or no ECC)"))
    else:
        out.append(passed("health.row-remap-pending", "no row remapping pending"))
    if fail:
        out.append(failed("health.row-remap-failed", "row remapping failed on " + ", ".join(fail),
                          "the GPU has no spare rows left for the failing memory: replace it (RMA)"))
    elif not known:
        out.append(skipped("health.row-remap-failed", "no GPU supports row remapping"))
    else:
        out.append(passed("health.row-remap-failed", "no row remapping failure"))
    return out


def _pcie(h: HealthFacts) -> Finding:
    narrow = [(i, g) for i, g in enumerate(h.gpus) if g.width_max and g.width_current and g.width_current < g.width_max]
    if narrow:
        return failed("health.pcie-width", "PCIe link narrower than it can be: " +
                      ", ".join(f"GPU {i} ({g.bus}) x{g.width_current} of x{g.width_max}" for i, g in narrow),
                      "reseat the GPU (or its riser) and check the slot: a degraded link slows every transfer")
    if not any(g.width_max for g in h.gpus):
        return skipped("health.pcie-width", "no GPU reports its PCIe link width")
    return passed("health.pcie-width", "every GPU's PCIe link at its full width")


def _nvlink(h: HealthFacts) -> Finding:
    if not h.nvlink:
        return skipped("health.nvlink-down", "no NVLink (nvidia-smi nvlink -s lists no link)")
    down = [f"GPU {g.index} link(s) {', '.join(map(str, g.inactive))}" for g in h.nvlink if g.inactive]
    if down:
        return failed("health.nvlink-down", "NVLink down: " + "; ".join(down),
                      "drain the node and reset the GPUs or reboot; if a link stays inactive, contact the server's "
                      "vendor (GPU, baseboard or NVSwitch)")
    return passed("health.nvlink-down", f"every NVLink link active ({sum(g.links for g in h.nvlink)} links)")


def _clocks(h: HealthFacts) -> Finding:
    slow = [(i, g) for i, g in enumerate(h.gpus) if g.slowdowns]
    if slow:
        return failed("health.clocks-slowdown", "the hardware slows the clocks of " +
                      ", ".join(f"GPU {i} ({', '.join(g.slowdowns)})" for i, g in slow),
                      "check cooling (temperatures in nvidia-smi -q) and power (a power brake comes from the "
                      "chassis or PSU); a GPU held slow makes every job on the node slow")
    return passed("health.clocks-slowdown", "no hardware clock slowdown")


def _fabric(facts: HostFacts, h: HealthFacts) -> Finding:
    known = [(i, g) for i, g in enumerate(h.gpus) if g.fabric_state not in ("", "N/A")]
    if not known:
        return skipped("health.fabric", "no NVSwitch fabric (or the driver does not report it)")
    bad = [(i, g) for i, g in known if g.fabric_state != "Completed" or g.fabric_status != "Success"]
    if bad:
        return failed("health.fabric", "the NVSwitch fabric is not ready on " +
                      ", ".join(f"GPU {i} ({g.fabric_state}, {g.fabric_status})" for i, g in bad),
                      f"check nvidia-fabricmanager (it is {facts.driver.fabric_manager} here): it must run at the "
                      "driver's version before CUDA can use the GPUs (error 802 otherwise)")
    return passed("health.fabric", f"NVSwitch fabric Completed/Success on {len(known)} GPU(s)")
