"""Pure parsers of nvidia-smi's MIG outputs: any text in, a value or ParseError out (never anything else).

The probe's `mig` section (gpuk8s/facts/probe.sh) holds sub-sections framed by lines `@@mig NAME RC`:
`mode` (`nvidia-smi --query-gpu=index,uuid,mig.mode.current,mig.mode.pending --format=csv,noheader`),
`lgip`, `lgi`, `lci` (`nvidia-smi mig -lgip|-lgi|-lci`: box tables, only where a GPU is in MIG mode) and
`apps` (`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name --format=csv,noheader`). The table
layouts are those real drivers print: tests/fixtures/real/mig holds real outputs with their sources (R450 to
R610; A30, A100 40/80GB, H100, H200, RTX PRO 6000 Blackwell) and tests/unit/test_real_corpus_smi.py reads them
all. Two layouts of `-lci` are real: the six-column table of the MIG user guide's early examples and the
seven-column one of later drivers, whose last column is the compute instance's Placement `Start:Size`.
Profile names carry suffixes beyond `+me`: `+me.all`, `+gfx` and `-me` (RTX PRO 6000 Blackwell, R575+), and
a compute instance smaller than its GPU instance is named `1c.3g.20gb`.
Host output is hostile data: names are kept short and printable, numbers are ASCII digits only.
"""

from __future__ import annotations

import re

from gpuk8s.errors import ParseError
from gpuk8s.facts.model import GpuProcess, MigComputeInstance, MigFacts, MigGPU, MigGpuInstance, MigProfile
from gpuk8s.text import subsections

MAX_ROWS = 4096  # more rows than any board has: the rest is ignored
_NUM = re.compile(r"^[0-9]{1,9}$")
# 1g.10gb, 1g.10gb+me, 1g.24gb+me.all, 1g.24gb+gfx, 1g.24gb-me (GPU instances); 1c.3g.20gb (compute instances)
_PROFILE = re.compile(r"^[0-9]{1,2}[gc]\.[.0-9a-z+-]{1,24}$")
_MODE = ("Enabled", "Disabled", "[N/A]", "N/A")
_SUB = re.compile(r"^@@mig ([a-z]{1,8}) (-?[0-9]{1,9})$")
_MIGDEV = re.compile(r"^\s+MIG ([0-9]{1,2}[gc]\.[.0-9a-z+-]{1,24})\s+Device\s+([0-9]{1,3}): "
                     r"\(UUID: ([!-~]{1,100})\)\s*$")
_GPULINE = re.compile(r"^GPU ([0-9]{1,3}): ")
_PLACEMENT = re.compile(r"^[0-9]{1,3}:[0-9]{1,3}$")


def _int(s: str) -> int:
    if not _NUM.match(s):
        raise ParseError(f"not a number: {s[:40]!r}")
    return int(s)


def _printable(s: str, n: int = 120) -> str:
    return "".join(c if c.isprintable() else "?" for c in s.strip())[:n]


def _empty(text: str) -> bool:
    """nvidia-smi's answers for "nothing here": No MIG-enabled devices found., No GPU instances found: ..."""
    t = text.strip()
    return t.startswith("No ") and "found" in t.split("\n", 1)[0]


def _rows(text: str, title: str) -> list[list[str]]:
    """The data rows of a box table whose first header cell reads `title` (e.g. 'GPU instances:')."""
    if _empty(text) or not text.strip():
        return []
    lines = text.splitlines()
    if not any(title in ln for ln in lines[:8]):
        raise ParseError(f"no {title!r} table: {_printable(text, 80)!r}")
    rows: list[list[str]] = []
    body = False
    for ln in lines:
        s = ln.strip()
        if s.startswith("|=") or s.startswith("+="):
            body = True
            continue
        if not body or not s.startswith("|"):
            continue
        cells = s.strip("|").split()
        if cells:
            rows.append(cells)
        if len(rows) >= MAX_ROWS:
            break
    if not body:
        raise ParseError(f"the {title!r} table has no header rule")
    return rows


def _profile(cells: list[str], at: int) -> str:
    if len(cells) <= at + 1 or cells[at] != "MIG" or not _PROFILE.match(cells[at + 1]):
        raise ParseError(f"unexpected row: {_printable(' '.join(cells), 80)!r}")
    return cells[at + 1]


def parse_lgip(text: str) -> tuple[MigProfile, ...]:
    """`nvidia-smi mig -lgip`: each profile's row (the second line of each, CE/JPEG/OFA, is skipped)."""
    out = []
    for cells in _rows(text, "GPU instance profiles:"):
        if len(cells) < 6 or cells[1] != "MIG":
            if all(_NUM.match(c) for c in cells):
                continue  # the CE / JPEG / OFA line
            raise ParseError(f"unexpected -lgip row: {_printable(' '.join(cells), 80)!r}")
        free, sep, total = cells[4].partition("/")
        if not sep:
            raise ParseError(f"unexpected Free/Total {cells[4][:20]!r}")
        out.append(MigProfile(_int(cells[0]), _profile(cells, 1), _int(cells[3]), _int(free), _int(total),
                              _printable(cells[5], 12)))
    return tuple(out)


def parse_lgi(text: str) -> tuple[MigGpuInstance, ...]:
    """`nvidia-smi mig -lgi`: GPU, profile name, profile ID, instance ID, placement start:size."""
    out = []
    for cells in _rows(text, "GPU instances:"):
        if len(cells) != 6:
            raise ParseError(f"unexpected -lgi row: {_printable(' '.join(cells), 80)!r}")
        if not _PLACEMENT.match(cells[5]):
            raise ParseError(f"unexpected placement {_printable(cells[5], 20)!r}")
        out.append(MigGpuInstance(_int(cells[0]), _profile(cells, 1), _int(cells[3]), _int(cells[4]), cells[5]))
    return tuple(out)


def parse_lci(text: str) -> tuple[MigComputeInstance, ...]:
    """`nvidia-smi mig -lci`: GPU, GPU instance ID, profile name, CI profile ID, CI ID and, in the tables of
    current drivers, the compute instance's Placement `Start:Size` (checked, not kept). Both layouts are real:
    the six-column one of the MIG user guide's A100 examples and the seven-column one of current drivers (R610
    in the corpus; public R515 captures show it too)."""
    out = []
    for cells in _rows(text, "Compute instances:"):
        if len(cells) not in (6, 7) or (len(cells) == 7 and not _PLACEMENT.match(cells[6])):
            raise ParseError(f"unexpected -lci row: {_printable(' '.join(cells), 80)!r}")
        out.append(MigComputeInstance(_int(cells[0]), _int(cells[1]), _profile(cells, 2), _int(cells[4]),
                                      _int(cells[5])))
    return tuple(out)


def parse_modes(text: str) -> tuple[tuple[int, str, str, str], ...]:
    """`--query-gpu=index,uuid,mig.mode.current,mig.mode.pending --format=csv,noheader`: (index, uuid,
    current, pending) per GPU; a GPU without MIG reads [N/A]."""
    out = []
    for ln in text.splitlines()[:MAX_ROWS]:
        if not ln.strip():
            continue
        cols = [c.strip() for c in ln.split(",")]
        if len(cols) != 4 or cols[2] not in _MODE or cols[3] not in _MODE:
            raise ParseError(f"unexpected MIG mode line: {_printable(ln, 80)!r}")
        out.append((_int(cols[0]), _printable(cols[1], 100), "[N/A]" if "N/A" in cols[2] else cols[2],
                    "[N/A]" if "N/A" in cols[3] else cols[3]))
    if not out:
        raise ParseError("nvidia-smi listed no GPUs")
    return tuple(out)


def parse_compute_apps(text: str) -> tuple[GpuProcess, ...]:
    """`--query-compute-apps=gpu_uuid,pid,process_name --format=csv,noheader` (empty: no processes)."""
    out = []
    for ln in text.splitlines()[:MAX_ROWS]:
        if not ln.strip() or ln.strip().startswith("No running"):
            continue
        uuid, sep, rest = ln.partition(",")
        pid, sep2, name = rest.partition(",")
        if not (sep and sep2):
            raise ParseError(f"unexpected compute-apps line: {_printable(ln, 80)!r}")
        out.append(GpuProcess(_printable(uuid, 100), _int(pid.strip()), _printable(name, 80)))
    return tuple(out)


def parse_list(text: str) -> dict[int, tuple[tuple[str, str], ...]]:
    """`nvidia-smi -L`: per GPU index its MIG devices (profile, MIG UUID), in order. A MIG device is named by
    its GPU instance profile (3g.40gb) or, for a compute instance smaller than its GPU instance, by both
    (1c.3g.71gb); its UUID is MIG-<uuid> (R470 on) or MIG-GPU-<uuid>/<gi>/<ci> (R450)."""
    out: dict[int, list[tuple[str, str]]] = {}
    gpu: int | None = None
    for ln in text.splitlines()[:MAX_ROWS]:
        m = _GPULINE.match(ln)
        if m:
            gpu = int(m.group(1))
            out.setdefault(gpu, [])
            continue
        d = _MIGDEV.match(ln)
        if d and gpu is not None:
            out[gpu].append((d.group(1), d.group(3)))
        elif ln.strip():
            raise ParseError(f"unexpected nvidia-smi -L line: {_printable(ln, 80)!r}")
    return {k: tuple(v) for k, v in out.items()}


def split(text: str) -> dict[str, tuple[int, str]]:
    """The `@@mig NAME RC` sub-sections of the probe's mig section."""
    return subsections(text, _SUB)


def parse_section(text: str, rc: int = 0) -> MigFacts:
    """The probe's whole `mig` section; never raises: what cannot be read is the result's error."""
    if rc == 127:
        return MigFacts("absent", error="nvidia-smi: command not found")
    try:
        parts = split(text)
        mrc, mtext = parts.get("mode", (1, "no MIG mode query in the probe output"))
        if mrc != 0:
            return MigFacts("failed", error=_printable(mtext, 300) or f"exit status {mrc}")
        modes = parse_modes(mtext)

        def part(name: str) -> str:
            prc, ptext = parts.get(name, (0, ""))
            if prc != 0 and not _empty(ptext):
                raise ParseError(f"nvidia-smi mig -{name}: {_printable(ptext, 200)} (exit status {prc})")
            return ptext

        profiles = parse_lgip(part("lgip"))
        gis = parse_lgi(part("lgi"))
        cis = parse_lci(part("lci"))
        arc, atext = parts.get("apps", (0, ""))
        apps = parse_compute_apps(atext) if arc == 0 else ()
    except ParseError as e:
        return MigFacts("failed", error=str(e)[:300])
    gpus = tuple(MigGPU(i, uuid, cur, pend,
                        tuple(p for p in profiles if p.gpu == i), tuple(g for g in gis if g.gpu == i),
                        tuple(c for c in cis if c.gpu == i), tuple(a for a in apps if a.gpu_uuid == uuid))
                 for i, uuid, cur, pend in modes)
    return MigFacts("ok", gpus)
