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

The fabric level (`--level fabric`, issue 43) adds health.rdma-links on hosts whose inventory sets `fabric:`: each
port of the fabric Active/LinkUp at the expected rate, and none of its error counters above zero (the kernel's PMA
counters, infiniband-diags' ibqueryerrors default threshold): a link with errors retransmits while its rate still
reads full; before a node joins, no pod is needed to see it.
"""

from __future__ import annotations

from gpuk8s import fabricplan
from gpuk8s.driver.xid import is_fatal, lookup, recovery_action
from gpuk8s.facts.dcgm import DiagReport
from gpuk8s.facts.health import HealthFacts
from gpuk8s.facts.model import HostFacts
from gpuk8s.findings import Finding, failed, passed, skipped
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Host
from gpuk8s.text import first_of

QUICK = ("health.gpu-count", "health.xid", "health.xid-app", "health.ecc-uncorrected", "health.retired-pages-pending",
         "health.row-remap-pending", "health.row-remap-failed", "health.pcie-width", "health.nvlink-down",
         "health.clocks-slowdown", "health.fabric")


MAX_NAMED = 16  # GPUs a message names; the rest counted (a host's nvidia-smi -q may list any number of GPUs)


def named(items: list[str]) -> str:
    return first_of(items, MAX_NAMED)


def _gpu_names(h: HealthFacts, buses: list[str], index: dict[str, int] | None = None) -> str:
    """Each bus as `GPU i (bus)`, at most MAX_NAMED of them; `index` (bus -> position in nvidia-smi -q) built once
    by a caller that names GPUs in a loop."""
    index = _index(h) if index is None else index
    return named([f"GPU {index[b]} ({b})" if b in index else b for b in buses[:MAX_NAMED]]
                 + buses[MAX_NAMED:])


def _index(h: HealthFacts) -> dict[str, int]:
    return {g.bus: i for i, g in enumerate(h.gpus)}


def judge(host: Host, facts: HostFacts, h: HealthFacts) -> list[Finding]:
    """The quick level's findings for one host, in QUICK's order; a check the host cannot answer is skipped with
    the reason (no driver, nvidia-smi failed, no kernel log)."""
    g = facts.gpu
    if not is_gpu_node(host):
        return [skipped(i, "not a GPU host (gpus: 0 or a control plane without GPUs)") for i in QUICK]
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
    # Every Xid since boot is judged: a GPU reset clears the GPU but not the kernel's log, and nothing the driver
    # prints proves a reset came after the Xid, so a host stays failing until it reboots (conservative: a GPU
    # quarantined too long is better than one released with a DBE). What the GPU reports now is added to it:
    # "GPU Reset Status" (R535+) saying a reset is required or recommended fails the host without any Xid line.
    fatal: dict[int, list[str]] = {}
    other: dict[int, int] = {}
    firsts = h.kernel.firsts or tuple((e, 1) for e in h.kernel.xids)
    for e, count in firsts:
        if is_fatal(e):
            fatal.setdefault(e.xid, []).append(e.bus)
        else:
            other[e.xid] = other.get(e.xid, 0) + count
    # every lookup a set or a dict built once: a host may list any number of GPUs owing a reset (16,000 GPUs took
    # 20 s when each rebuilt the index), and the message names at most MAX_NAMED of them
    in_fatal = {b for buses in fatal.values() for b in buses}
    fell_79 = set(fatal.get(79, ()))
    owed = [g.bus for g in h.gpus if (g.reset_required or g.drain_reset) and g.bus not in in_fatal]
    fallen = [b for b in h.kernel.fallen if b not in fell_79]
    out: list[Finding] = []
    if fatal or fallen or owed:
        index = _index(h)
        action = {e.xid: recovery_action(e) for e, _ in reversed(firsts) if e.xid == 154 and is_fatal(e)}
        parts = [f"Xid {n} ({lookup(n).meaning}" + (f": {action[n]}" if n in action else "")
                 + f") on {_gpu_names(h, sorted(set(b)), index)}" for n, b in sorted(fatal.items())]
        parts += [f"GPU {b} fell off the bus (no Xid line)" for b in fallen]  # at most MAX_FALLEN
        if owed:
            parts.append(f"{_gpu_names(h, owed, index)} report{'s' if len(owed) == 1 else ''} GPU Reset Required / "
                         "Drain and Reset Recommended")
        first = min(fatal) if fatal else 79 if fallen else 95  # 95: NVIDIA's RESET_GPU remedy
        ev = [e.line for e, _ in firsts if is_fatal(e)][:8] or [f"fell off the bus: {b}" for b in fallen]
        out.append(failed("health.xid", "since boot: " + "; ".join(parts), lookup(first).remedy +
                          " (the kernel's Xid lines stay until a reboot: after a GPU reset the host still fails this "
                          "check until it reboots)", evidence=ev))
    else:
        out.append(passed("health.xid", "no Xid that needs a GPU reset or a reboot since boot"))
    if other:
        parts = [f"Xid {n} ({lookup(n).meaning}) x{c}" for n, c in sorted(other.items())]
        more = f" ({h.kernel.more} Xid lines past the first {len(h.kernel.xids)} only counted)" \
            if h.kernel.more else ""
        out.append(failed("health.xid-app", "since boot: " + ", ".join(parts) + more,
                          lookup(min(other)).remedy,
                          evidence=[e.line for e, _ in firsts if not is_fatal(e)][:8]))
    else:
        out.append(passed("health.xid-app", "no other Xid since boot"))
    return out


def _per_gpu(fid: str, bad: list[str], known: bool, what: str, remedy: str, unknown: str, fine: str) -> Finding:
    """A check over every GPU: failed naming the GPUs where it holds, skipped when no GPU reports the value, else
    passed."""
    if bad:
        return failed(fid, f"{what} on " + named(bad), remedy)
    if not known:
        return skipped(fid, unknown)
    return passed(fid, fine)


def _memory(h: HealthFacts) -> list[Finding]:
    name = [f"GPU {i} ({g.bus})" for i, g in enumerate(h.gpus)]  # built once; _per_gpu names at most MAX_NAMED
    return [
        _per_gpu("health.ecc-uncorrected",
                 [f"{name[i]}: {g.uncorrected_volatile}" for i, g in enumerate(h.gpus) if g.uncorrected_volatile],
                 any(g.uncorrected_volatile is not None for g in h.gpus),
                 "uncorrectable ECC errors since the driver loaded",
                 "drain the node and reset the GPU or reboot; on Ampere and newer see whether a row remap is pending "
                 "(health.row-remap-pending); RMA when it repeats",
                 "no GPU reports ECC error counts (ECC off or not supported)",
                 "no uncorrectable ECC error since the driver loaded"),
        _per_gpu("health.retired-pages-pending", [name[i] for i, g in enumerate(h.gpus) if g.retired_pending],
                 any(g.retired_pending is not None for g in h.gpus), "page retirement pending",
                 "drain the node and reboot it: the retired pages are applied when the driver reloads",
                 "no GPU uses page retirement (Ampere and newer remap rows)", "no page retirement pending"),
        _per_gpu("health.row-remap-pending", [name[i] for i, g in enumerate(h.gpus) if g.remap_pending],
                 any(g.remap_pending is not None for g in h.gpus), "row remapping pending",
                 "drain the node and reset the GPU (nvidia-smi -r -i N) or reboot: the remap takes effect then; until "
                 "it does, the bad row can fail jobs again",
                 "no GPU supports row remapping (before Ampere, or no ECC)", "no row remapping pending"),
        _per_gpu("health.row-remap-failed", [name[i] for i, g in enumerate(h.gpus) if g.remap_failed],
                 any(g.remap_failed is not None for g in h.gpus), "row remapping failed",
                 "the GPU has no spare rows left for the failing memory: replace it (RMA)",
                 "no GPU supports row remapping", "no row remapping failure"),
    ]


def _pcie(h: HealthFacts) -> Finding:
    narrow = [(i, g) for i, g in enumerate(h.gpus) if g.width_max and g.width_current and g.width_current < g.width_max]
    if narrow:
        return failed("health.pcie-width", "PCIe link narrower than it can be: " +
                      named([f"GPU {i} ({g.bus}) x{g.width_current} of x{g.width_max}" for i, g in narrow]),
                      "reseat the GPU (or its riser) and check the slot: a degraded link slows every transfer")
    if not any(g.width_max for g in h.gpus):
        return skipped("health.pcie-width", "no GPU reports its PCIe link width")
    return passed("health.pcie-width", "every GPU's PCIe link at its full width")


def _nvlink(h: HealthFacts) -> Finding:
    # A GPU whose every link is down prints no link at all ("all links are inActive"): it is down only where NVLink
    # is in use on the host (another GPU lists links); a host of PCIe GPUs without bridges says it for every GPU.
    used = any(g.links for g in h.nvlink)
    if not used:
        return skipped("health.nvlink-down", "no NVLink in use (nvidia-smi nvlink -s lists no active link)")
    down = [f"GPU {g.index} link(s) {', '.join(map(str, g.inactive))}" for g in h.nvlink if g.inactive]
    down += [f"GPU {g.index} every link" for g in h.nvlink if g.all_inactive]
    if down:
        return failed("health.nvlink-down", "NVLink down: " + named(down),
                      "drain the node and reset the GPUs or reboot; if a link stays inactive, contact the server's "
                      "vendor (GPU, baseboard or NVSwitch)")
    return passed("health.nvlink-down", f"every NVLink link active ({sum(g.links for g in h.nvlink)} links)")


def _clocks(h: HealthFacts) -> Finding:
    slow = [(i, g) for i, g in enumerate(h.gpus) if g.slowdowns]
    if slow:
        return failed("health.clocks-slowdown", "the hardware slows the clocks of " +
                      named([f"GPU {i} ({', '.join(g.slowdowns)})" for i, g in slow]),
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
                      named([f"GPU {i} ({g.fabric_state}, {g.fabric_status})" for i, g in bad]),
                      f"check nvidia-fabricmanager (it is {facts.driver.fabric_manager} here): it must run at the "
                      "driver's version before CUDA can use the GPUs (error 802 otherwise)")
    return passed("health.fabric", f"NVSwitch fabric Completed/Success on {len(known)} GPU(s)")


# The standard and long levels: the dcgmi diag level each runs (docs/health.md); the one table of them
DCGM_RUNS = {"standard": 2, "long": 3}
LEVELS = ("quick", *DCGM_RUNS, "fabric")


def judge_rdma(host: Host, facts: HostFacts, h: HealthFacts) -> Finding:
    """health.rdma-links (the fabric level): the fabric's ports (fabricplan: fabric.nics of its link layer, as
    cabled) each Active/LinkUp at fabric.expect.rate, and no error counter of theirs above zero."""
    plan = fabricplan.plan(host, facts)
    if plan is None:
        return skipped("health.rdma-links", "no RDMA fabric: the inventory sets no fabric: here, or no port of its "
                       "link layer was read")
    bad = []
    for p in plan.ports:
        name = fabricplan.port_name(p.device, p.port)
        if not p.active:
            bad.append(f"{name} {p.state}/{p.physical_state}")
        elif plan.expect_rate and p.rate is not None and p.rate < plan.expect_rate:
            bad.append(f"{name} at {p.rate:g} Gb/s, not {plan.expect_rate}")
        errors = {k: v for k, v in (h.rdma_counters or {}).get((p.device, p.port), {}).items() if v > 0}
        if errors:
            bad.append(f"{name}: " + ", ".join(f"{k} {v}" for k, v in errors.items()))
    if bad:
        return failed("health.rdma-links", "; ".join(bad),
                      "a port down or slow: its cable, transceiver and switch port (gpuk8s preflight names the "
                      "state); errors counted: the link retransmits at its full rate's reading, reseat or replace "
                      "the cable or transceiver named (mlxlink -d DEV -m: BER), then clear the port's counters "
                      "(perfquery -x -R -C DEV -P PORT) and run gpuk8s health --level fabric again")
    active = (f"{len(plan.ports)} {fabricplan.NAMES[plan.link_layer]} port(s) Active"
              + (f" at {plan.rate:g} Gb/s" if plan.rate else ""))
    if h.rdma_counters is None:  # the ports' state and rate are judged; their errors are not known
        return skipped("health.rdma-links", f"{active}; their error counters could not be read")
    return passed("health.rdma-links", active + ", no error counted")


def judge_dcgm(level: str, report: DiagReport | None) -> Finding:
    """health.dcgm-diag: DCGM's diagnostic of the standard (-r 2) or long (-r 3) level; `report` None: DCGM is not
    installed on the host (skipped, said: the quick level's checks ran, this one did not)."""
    run = f"dcgmi diag -r {DCGM_RUNS[level]}"
    if report is None:
        return skipped("health.dcgm-diag", f"DCGM is not installed: the {level} level's diagnostic ({run}) was not "
                       "run; the quick level's checks ran",
                       "install DCGM (NVIDIA's datacenter-gpu-manager-4 package for the driver's CUDA major) and start "
                       "nvidia-dcgm, then run gpuk8s health --level " + level + " again")
    if not report.read:
        return failed("health.dcgm-diag", f"{run} gave no result: {report.error}",
                      "check DCGM's host engine (systemctl status nvidia-dcgm), then run " + run + " -j by hand")
    where = f"DCGM {report.version or '?'}" + (f", driver {report.driver}" if report.driver else "")
    bad = report.failed
    evidence = [f"{r.category}/{r.test} GPU {r.gpu or '-'}: {r.status}" + (f": {'; '.join(r.warnings)}"
                                                                            if r.warnings else "")
                for r in bad + report.warned][:20]
    if bad:
        names = sorted({f"{r.test} (GPU {r.gpu})" if r.gpu else r.test for r in bad})
        first = next((w for r in bad for w in r.warnings), "")
        return failed("health.dcgm-diag", f"{run} ({where}): {len(bad)} result(s) failed: {', '.join(names[:8])}"
                      + (f": {first}" if first else ""),
                      "DCGM's warning says what to do (NVIDIA's DCGM diagnostics guide lists each test); a hardware "
                      "test that keeps failing after a GPU reset or a reboot means the GPU needs replacing",
                      evidence=evidence)
    counted = f"{len(report.results)} result(s)" + (f" (and {report.more} more)" if report.more else "")
    warned = f", {len(report.warned)} with a warning" if report.warned else ""
    # a test DCGM skipped (not allowed on this GPU model, not run at this level) is said, never counted as passed
    skips = sorted({r.test for r in report.results if r.status in ("skip", "not-run")})
    skipped_ = f", not run: {', '.join(skips[:8])}" if skips else ""
    return passed("health.dcgm-diag", f"{run} ({where}): {counted}, none failed{warned}{skipped_}",
                  evidence=evidence)
