"""GPU health facts from real texts (pure): `nvidia-smi -q`, `nvidia-smi nvlink -s` and the kernel's NVRM lines.

What `gpuk8s health` reads on a host (gpuk8s/health/run.py runs the commands; gpuk8s/health/checks.py judges):

- `nvidia-smi -q` (--query): per GPU its ECC errors (the volatile uncorrectable counters: since the driver loaded),
  retired pages pending (before Ampere), row remapping pending or failed (Ampere and newer), the PCIe link width
  (current against max), the clock slowdown reasons ("Clocks Event Reasons" from R535, "Clocks Throttle Reasons"
  before), persistence mode and the NVSwitch fabric's state (Hopper and newer). Every layout in
  tests/fixtures/real/health (A10, H100, TITAN V, RTX 4090; drivers 535 and 560) is read: the old per-location ECC
  table ("Double Bit" / "Total"), `Remapped Rows : N/A` on one line, N/A everywhere on a GPU without ECC.
- `nvidia-smi nvlink -s`: per GPU its links, `<inactive>` for one that is down; nothing at all without NVLink.
- The kernel log's NVRM lines: `NVRM: Xid (PCI:DDDD:BB:DD[ GPU-I:NN[ GPU-CI:NN]]): XID, [pid=P, name=N, ]TEXT` as
  every driver since 515 writes it (the pid and name always up to 565, only when known from 570), in dmesg's or
  journalctl's framing, and the fallen-off-the-bus lines that come without an Xid (`NVRM: GPU DDDD:BB:DD.F: GPU has
  fallen off the bus.`, and from 570 `NVRM: The NVIDIA GPU DDDD:BB:DD.F` ... `fallen off the bus and is not
  responding to commands.` over several lines).

Everything here is host text: parsed line by line in linear time, bounded (MAX_LINES, MAX_EVENTS, MAX_TEXT), never
trusted further than a number or a short cleaned string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from itertools import islice

from gpuk8s.facts.fabric import ERROR_COUNTERS, parse_port_counters
from gpuk8s.facts.parse import ParseError, split_sections
from gpuk8s.text import ascii_int, one_line

MAX_LINES = 200_000  # an 8-GPU `nvidia-smi -q` is ~1,650 lines; a kernel log section is cut at 256 KiB before this
MAX_EVENTS = 256  # Xid lines kept per host (the first ones: a storm of Xid 94 repeats itself)
MAX_TEXT = 200  # characters kept of an Xid's text
MAX_FALLEN = 64  # GPUs kept that the kernel says fell off the bus (a real server has at most 16 GPUs)


def bus_key(text: str) -> str | None:
    """A PCI address as one key, `dddd:bb:dd` lower case, from nvidia-smi's `00000000:07:00.0`, the kernel's
    `PCI:0000:07:00` or `0000:07:00.0`; None for anything else. The function number is left out: the driver
    names a GPU by domain, bus and device only."""
    m = _BUS.fullmatch(text.strip().lower().removeprefix("pci:"))
    if not m:
        return None
    return f"{m.group(1)[-4:]}:{m.group(2)}:{m.group(3)}"


_BUS = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})(?:\.[0-7])?")


# -- the host side: sections after the fact probe's, in its framing (gpuk8s/facts/probe.sh: `quick` bounds each at
# 256 KiB; `smi` is the probe's nvidia-smi, not called again once one has hung). gpuk8s health runs both; doctor the
# kernel's. The kernel's NVRM lines since boot: journalctl -k -b 0 where the journal has the kernel's messages, else
# dmesg; only the lines that name an Xid or a GPU off the bus, at most 4,000 (klog_cut).
# the lines kept: an Xid, a GPU the driver says fell off the bus (one line, or the 570+ text over three)
KERNEL_PATTERN = r"NVRM: (Xid|GPU [0-9a-fA-F]{4,8}:|The NVIDIA GPU|fallen off the bus)"
# The fabric level's section: each RDMA port's error counters, printed as `grep -H . FILE` prints them (PATH:VALUE);
# files only, no tool
RDMA_SECTION = f"""
rdmacnt() {{ for p in /sys/class/infiniband/*/ports/*; do [ -d "$p/counters" ] || continue
  for c in {' '.join(ERROR_COUNTERS)}; do
    v=; read -r v 2>/dev/null < "$p/counters/$c" && printf '%s:%s\\n' "$p/counters/$c" "$v"; done; done; true; }}
quick health-rdma-counters rdmacnt
"""
SMI_SECTIONS = """
smiq() { smi -q; }
quick health-smi-q smiq
nvl() { smi nvlink -s; }
quick health-nvlink nvl
"""
KERNEL_SECTION = f"""
klog() {{
  # $T: the probe's timeout (20 s) where the host has one: a large journal must not hold the whole probe. journalctl
  # reads from the boot on, so one cut short lost the newest lines: its exit status is kept (the last line) and a
  # journalctl that failed or ran out of time gives way to the kernel's ring buffer, which has the newest
  if command -v journalctl >/dev/null 2>&1 && [ -n "$($T journalctl -k -b 0 -q -n 1 --no-pager 2>/dev/null)" ]; then
    o=$({{ $T journalctl -k -b 0 -q --no-pager 2>/dev/null; echo "@@journalctl-rc $?"; }} |
        grep -E '{KERNEL_PATTERN}|^@@journalctl-rc ')
    if [ "${{o##*@@journalctl-rc }}" = 0 ]; then
      printf '%s\n' "$o" | grep -v '^@@journalctl-rc ' | klog_cut
      return 0
    fi
  fi
  command -v dmesg >/dev/null 2>&1 || {{ echo "neither journalctl nor dmesg is installed"; return 127; }}
  # dmesg's own failure (kernel.dmesg_restrict without root) is the section's error, not an empty log
  o=$(dmesg 2>&1) || {{ printf '%s\\n' "$o" | head -c 300; return 1; }}
  printf '%s\\n' "$o" | grep -E '{KERNEL_PATTERN}' | klog_cut
  return 0
}}
# at most 4,000 lines: the first 2,000, then only a line whose Xid number and GPU were not seen yet (or a GPU off the
# bus): a storm of one Xid cannot crowd out a later, different one
klog_cut() {{
  awk 'n >= 4000 {{ exit }}
       {{ k = $0; if (match(k, /Xid \\([^)]*\\): [0-9]+/)) k = substr(k, RSTART, RLENGTH); else k = "" }}
       NR <= 2000 || k == "" || !(k in s) {{ s[k] = 1; print; n++ }}'
}}
quick health-kernel klog
"""


# -- nvidia-smi -q ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuHealth:
    """One GPU of `nvidia-smi -q`. None: the GPU does not report it (N/A, [Not Supported], absent)."""

    bus: str  # bus_key of the `GPU 00000000:07:00.0` line
    name: str = ""
    persistence: str = ""  # Enabled | Disabled | ''
    ecc_mode: str = ""  # Enabled | Disabled | N/A | ''
    uncorrected_volatile: int | None = None  # uncorrectable ECC errors since the driver loaded (SRAM + DRAM)
    uncorrected_aggregate: int | None = None  # over the GPU's life (the InfoROM)
    retired_pending: bool | None = None  # "Retired Pages / Pending Page Blacklist" (page retirement, before Ampere)
    remap_pending: bool | None = None  # "Remapped Rows / Pending": a GPU reset activates the remap
    remap_failed: bool | None = None  # "Remapped Rows / Remapping Failure Occurred"
    remap_uncorrectable: int | None = None  # rows remapped for uncorrectable errors
    width_max: int | None = None  # PCIe link width the GPU and slot can do (16 for "16x")
    width_current: int | None = None
    slowdowns: tuple[str, ...] = ()  # the active clock slowdown reasons gpuk8s judges (HW_REASONS)
    fabric_state: str = ""  # Completed | In Progress | Not Started | N/A | '' (no Fabric section)
    fabric_status: str = ""  # Success | an error | N/A | ''
    reset_required: bool | None = None  # "GPU Reset Status / Reset Required" (R535+): the driver's own word, now
    drain_reset: bool | None = None  # "GPU Reset Status / Drain and Reset Recommended"


# The clock event reasons that say the hardware is slowing the GPU down (not idle, not an application's or the
# administrator's power cap): the GPU is too hot, or its power supply asked for a brake.
HW_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")
_CLOCKS = ("Clocks Event Reasons", "Clocks Throttle Reasons")  # R535 renamed the section
_GPU_LINE = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*")


def _field(line: str) -> tuple[int, str, str | None]:
    """(indent, name, value or None for a section heading) of one `nvidia-smi -q` line, by string operations
    (linear: a regex with a lazy name and optional spaces is quadratic on a long line without a colon)."""
    body = line.lstrip(" ")
    name, colon, value = body.partition(":")
    return len(line) - len(body), name.strip(), (value[1:] if value.startswith(" ") else value) if colon else None


def _count(value: str) -> int | None:
    return ascii_int(value.strip(), 12)


def _yes(value: str) -> bool | None:
    v = value.strip()
    return True if v == "Yes" else False if v == "No" else None


def _width(value: str) -> int | None:
    v = value.strip()
    return ascii_int(v[:-1], 2) if v.endswith("x") else None


def parse_smi_query(text: str) -> tuple[GpuHealth, ...]:
    """Each GPU of `nvidia-smi -q` with what health needs; () for a text with no `GPU dddd:bb:dd.f` line (an
    error). The path of a field is found by its indentation (4 spaces a level), one pass over the lines."""
    gpus: list[GpuHealth] = []
    cur: dict[str, object] | None = None
    path: list[tuple[int, str]] = []  # (indent, name) of the open sections above the current line
    unc_vol: list[int] = []
    unc_agg: list[int] = []
    seen_vol = seen_agg = False
    slow: list[str] = []

    def finish() -> None:
        if cur is not None:
            cur["uncorrected_volatile"] = sum(unc_vol) if seen_vol else None
            cur["uncorrected_aggregate"] = sum(unc_agg) if seen_agg else None
            cur["slowdowns"] = tuple(slow)
            gpus.append(GpuHealth(**cur))  # type: ignore[arg-type]

    for raw in islice(text.splitlines(), MAX_LINES):
        line = raw[:400].rstrip()
        g = _GPU_LINE.fullmatch(line)
        if g:
            finish()
            key = bus_key(g.group(1))
            cur = {"bus": key or ""}
            path, unc_vol, unc_agg, slow = [], [], [], []
            seen_vol = seen_agg = False
            continue
        if cur is None or not line.strip():
            continue
        indent, name, value = _field(line)
        while path and path[-1][0] >= indent:
            path.pop()
        if value is None:  # a section heading
            path.append((indent, name))
            continue
        where = tuple(p for _, p in path)
        top = where[0] if where else ""
        if not where:
            if name == "Product Name":
                cur["name"] = one_line(value)[:80]
            elif name == "Persistence Mode":
                cur["persistence"] = value.strip()[:20]
            elif name == "Remapped Rows":  # `Remapped Rows : N/A` on GPUs without row remapping
                cur["remap_pending"] = cur["remap_failed"] = None
        elif where == ("ECC Mode",) and name == "Current":
            cur["ecc_mode"] = value.strip()[:20]
        elif top == "ECC Errors" and len(where) >= 2 and where[1] in ("Volatile", "Aggregate"):
            # SRAM/DRAM Uncorrectable[ Parity| SEC-DED] (Ampere and newer), Double Bit / Total (older)
            if "Uncorrectable" in name or (where[2:] == ("Double Bit",) and name == "Total"):
                v = _count(value)
                if where[1] == "Volatile":
                    seen_vol = seen_vol or v is not None
                    unc_vol.append(v or 0)
                else:
                    seen_agg = seen_agg or v is not None
                    unc_agg.append(v or 0)
        elif top == "Retired Pages" and name.startswith("Pending"):
            cur["retired_pending"] = _yes(value)
        elif where == ("Remapped Rows",):
            if name == "Pending":
                cur["remap_pending"] = _yes(value)
            elif name == "Remapping Failure Occurred":
                cur["remap_failed"] = _yes(value)
            elif name == "Uncorrectable Error":
                cur["remap_uncorrectable"] = _count(value)
        elif where[-1:] == ("Link Width",) and "GPU Link Info" in where:
            if name == "Max":
                cur["width_max"] = _width(value)
            elif name == "Current":
                cur["width_current"] = _width(value)
        elif top in _CLOCKS and name in HW_REASONS and value.strip() == "Active":
            slow.append(name)
        elif where == ("GPU Reset Status",):
            if name == "Reset Required":
                cur["reset_required"] = _yes(value)
            elif name == "Drain and Reset Recommended":
                cur["drain_reset"] = _yes(value)
        elif where == ("Fabric",):
            if name == "State":
                cur["fabric_state"] = value.strip()[:40]
            elif name == "Status":
                cur["fabric_status"] = one_line(value.strip())[:80]
    finish()
    return tuple(gpus)


# -- nvidia-smi nvlink -s -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NvlinkGpu:
    index: int
    name: str
    links: int  # links listed
    inactive: tuple[int, ...] = field(default=())  # the links printed as <inactive>
    all_inactive: bool = False  # "NVML: Unable to retrieve NVLink information as all links are inActive"


_NVL_GPU = re.compile(r"GPU (\d{1,3}): (.{1,120}?) \(UUID: [^)]{0,80}\)")
_NVL_LINK = re.compile(r"\s+Link (\d{1,3}): (.{1,40})")


def parse_nvlink_status(text: str) -> tuple[NvlinkGpu, ...]:
    """Each GPU's links of `nvidia-smi nvlink -s` (`Link N: 25 GB/s` or `Link N: <inactive>`); () without NVLink
    (nvidia-smi prints nothing there)."""
    out: list[NvlinkGpu] = []
    idx, name, links, dark = -1, "", 0, False
    inactive: list[int] = []
    for raw in islice(text.splitlines(), MAX_LINES):
        line = raw[:200].rstrip()
        g = _NVL_GPU.fullmatch(line)
        if g:
            if idx >= 0:
                out.append(NvlinkGpu(idx, name, links, tuple(inactive), dark))
            idx, name, links, inactive, dark = int(g.group(1)), one_line(g.group(2)), 0, [], False
            continue
        if idx >= 0 and _ALL_INACTIVE in line.lower():  # leptonai/gpud#1085: a B200 whose every link is down
            dark = True
            continue
        m = _NVL_LINK.fullmatch(line)
        if m and idx >= 0:
            links += 1
            if m.group(2).strip() == "<inactive>":
                inactive.append(int(m.group(1)))
    if idx >= 0:
        out.append(NvlinkGpu(idx, name, links, tuple(inactive), dark))
    return tuple(out)


_ALL_INACTIVE = "unable to retrieve nvlink information as all links are inactive"


# -- the kernel log -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class XidEvent:
    bus: str  # bus_key
    xid: int
    text: str  # what the driver said after the number (pid and name left out), cleaned, at most MAX_TEXT
    instance: str = ""  # 'GPU-I:05' or 'GPU-I:05 GPU-CI:01' on a MIG GPU
    line: str = ""  # the kernel's line from "NVRM:" on, cleaned, at most MAX_TEXT + 60 (the evidence)


_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
                  r"((?: GPU-C?I:\d{1,3}){0,2})\): (\d{1,5}),? ?(.*)")
_PIDNAME = re.compile(r"pid=(?:'<unknown>'|\d{1,10}), name=[^,]{0,100}, ")
_FELL = re.compile(r"NVRM: GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): GPU has fallen off the bus")
_THE_GPU = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_NOT_RESPONDING = "fallen off the bus and is not responding to commands"


@dataclass(frozen=True)
class KernelLog:
    xids: tuple[XidEvent, ...] = ()  # the first MAX_EVENTS Xid lines
    fallen: tuple[str, ...] = ()  # bus_keys the driver said fell off the bus (with or without an Xid 79)
    more: int = 0  # Xid lines past MAX_EVENTS, counted, not kept
    # each Xid number's first event on each GPU and how many lines it had, past MAX_EVENTS too: a storm of an
    # application's Xid 13 must not hide the Xid 79 after it (at most MAX_EVENTS pairs)
    firsts: tuple[tuple[XidEvent, int], ...] = ()


def parse_kernel_log(text: str) -> KernelLog:
    """The NVRM Xid events and fallen-off-the-bus GPUs in kernel log text (dmesg, dmesg -T or --time-format=iso,
    journalctl -k): whatever precedes `NVRM:` on a line (timestamp, host, 'kernel:') is left out."""
    xids: list[XidEvent] = []
    # an ordered set, capped as it fills: a membership test per line must cost O(1), not the list's length (a
    # hostile log of 40,000 distinct GPUs made a list search 9.8 s of CPU)
    fallen: dict[str, None] = {}
    firsts: dict[tuple[int, str], XidEvent] = {}  # (xid, bus) -> its first event
    lines: dict[tuple[int, str], int] = {}  # (xid, bus) -> how many lines it had (those of `firsts`)
    more = 0
    announced: str | None = None  # the GPU of a 570+ "The NVIDIA GPU ..." line, until its text ends
    for raw in islice(text.splitlines(), MAX_LINES):
        at = raw.find("NVRM: ", 0, 200)
        if at < 0:
            continue
        line = one_line(raw[at:at + 1000])
        m = _XID.match(line)
        if m:
            key = bus_key(m.group(1))
            if key is None:
                continue
            number = int(m.group(3))
            if number == 79 and key not in fallen and len(fallen) < MAX_FALLEN:
                fallen[key] = None
            seen = (number, key) in firsts
            if seen:
                lines[number, key] += 1
            if len(xids) >= MAX_EVENTS and (seen or len(firsts) >= MAX_EVENTS):
                more += 1
                continue
            rest = _PIDNAME.sub("", m.group(4), count=1) if m.group(4).startswith("pid=") else m.group(4)
            event = XidEvent(key, number, rest.strip()[:MAX_TEXT], m.group(2).strip(), line[:MAX_TEXT + 60])
            if not seen and len(firsts) < MAX_EVENTS:
                firsts[number, key], lines[number, key] = event, 1
            if len(xids) < MAX_EVENTS:
                xids.append(event)
            else:
                more += 1
            continue
        f = _FELL.match(line)
        if f:
            key = bus_key(f.group(1))
            if key and key not in fallen and len(fallen) < MAX_FALLEN:
                fallen[key] = None
            continue
        t = _THE_GPU.match(line)
        if t:
            announced = bus_key(t.group(1))
            continue
        if announced and _NOT_RESPONDING in line:
            if announced not in fallen and len(fallen) < MAX_FALLEN:
                fallen[announced] = None
            announced = None
    return KernelLog(tuple(xids), tuple(fallen), more, tuple((e, lines[k]) for k, e in firsts.items()))


# -- the host's health facts --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HealthFacts:
    """What the health sections read (gpuk8s/health/run.py): nvidia-smi -q per GPU, NVLink, the kernel log."""

    smi_read: bool = False
    smi_error: str = ""
    gpus: tuple[GpuHealth, ...] = ()
    nvlink: tuple[NvlinkGpu, ...] = ()
    kernel_read: bool = False
    kernel_error: str = ""
    kernel: KernelLog = field(default_factory=KernelLog)
    # the fabric level: each RDMA port's error counters ((device, port) -> name -> value); None: not read
    rdma_counters: dict[tuple[str, int], dict[str, int]] | None = None


def health_facts(smi: tuple[int, str] | None, nvlink: tuple[int, str] | None,
                 kernel: tuple[int, str] | None) -> HealthFacts:
    """HealthFacts from the probe's sections, each (exit status, output) or None when it did not come back."""
    smi_ok = smi is not None and smi[0] == 0
    gpus = parse_smi_query(smi[1]) if smi is not None and smi_ok else ()
    smi_error = "" if smi_ok and gpus else one_line((smi[1] if smi else "not run").strip())[:300] or "no GPU listed"
    kernel_ok = kernel is not None and kernel[0] == 0
    return HealthFacts(
        smi_read=smi_ok and bool(gpus), smi_error=smi_error, gpus=gpus,
        nvlink=parse_nvlink_status(nvlink[1]) if nvlink is not None and nvlink[0] == 0 else (),
        kernel_read=kernel_ok,
        kernel_error="" if kernel_ok else one_line((kernel[1] if kernel else "not run").strip())[:300],
        kernel=parse_kernel_log(kernel[1]) if kernel is not None and kernel_ok else KernelLog())


def read_health(stdout: str) -> HealthFacts:
    """The health sections (SMI_SECTIONS, KERNEL_SECTION) of one host's probe output; a section that did not come
    back reads as not run."""
    try:
        s = split_sections(stdout)
    except ParseError:
        s = {}

    def sec(name: str) -> tuple[int, str] | None:
        v = s.get(name)
        return (v.rc, v.output) if v is not None else None

    h = health_facts(sec("health-smi-q"), sec("health-nvlink"), sec("health-kernel"))
    rdma = sec("health-rdma-counters")
    return replace(h, rdma_counters=parse_port_counters(rdma[1])) if rdma is not None and rdma[0] == 0 else h
