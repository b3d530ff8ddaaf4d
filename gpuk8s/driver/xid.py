"""NVIDIA's Xid catalogue, the rows gpuk8s judges by (pure data).

Source: NVIDIA's "Xid Catalog" (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, for Ampere and newer
GPUs): per Xid its mnemonic, description and resolution buckets. The immediate action decides what gpuk8s does:
RESET_GPU, RESTART_BM (reboot the bare-metal node) and the 48 and NVLink workflows say the GPU is unfit until it is
reset or the node rebooted, so the host fails `gpuk8s health` (health.xid) and doctor says so;
RESTART_APP and IGNORE mean the fault was an application's (or an informational companion of another Xid): reported
(health.xid-app), never a quarantine. An Xid not in this table is reported as the latter with its number, so that a
new driver's Xid is seen, not silently dropped or blown up into a quarantine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuk8s.facts.health import XidEvent


@dataclass(frozen=True)
class Xid:
    number: int
    mnemonic: str
    meaning: str
    action: str  # NVIDIA's immediate action bucket
    fatal: bool  # the GPU needs a reset or the node a reboot: health.xid fails
    remedy: str


_RESET = "drain the node, reset the GPU (nvidia-smi -r -i N with no process on it) or reboot; RMA when it repeats"
_REBOOT = ("drain the node and reboot it (a GPU off the bus comes back only with a reboot or power cycle); check the "
           "GPU's seating, power and cooling, and RMA it when it repeats")
_APP = "an application's fault: look at the process the line names; nothing to do on the node unless it repeats"

CATALOGUE: dict[int, Xid] = {x.number: x for x in (
    Xid(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP", False, _APP),
    Xid(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP", False, _APP),
    Xid(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE", False, _APP),
    Xid(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45",
        False, "follows another Xid: act on that one"),
    Xid(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", True,
        "drain the node and reset the GPU or reboot (an uncorrectable ECC error is cleared only so); on Ampere and "
        "newer the reset also applies the row remap; RMA when it repeats"),
    Xid(63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", False,
        "a row was marked for remapping: health.row-remap-pending says whether a GPU reset is still owed"),
    Xid(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU", True, _RESET),
    Xid(74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", True,
        "drain the node and reset the GPU or reboot; if the link stays down (nvidia-smi nvlink -s), contact the "
        "server's vendor (the GPU, the baseboard or an NVSwitch)"),
    Xid(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM", True, _REBOOT),
    Xid(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", False,
        "corrected errors at a high rate: watch the GPU's ECC counters; contact support when it persists"),
    Xid(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP", False,
        "the error was contained to the application that hit it: restart it; the GPU stays usable"),
    Xid(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU", True, _RESET),
    Xid(119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", True, _RESET),
    Xid(120, "GSP_ERROR", "GSP Error", "RESET_GPU", True, _RESET),
    Xid(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154", False,
        "summarises the recovery another Xid needs: act on that one"),
    Xid(171, "UNCORRECTABLE_DRAM_ERROR", "Additional to Xid 48 providing more details", "WORKFLOW_XID_48", False,
        "accompanies an Xid 48: act on that one"),
)}


def lookup(number: int) -> Xid:
    """The catalogue's row for `number`, or an unknown Xid that is reported, not judged fatal."""
    return CATALOGUE.get(number) or Xid(number, "", "not in gpuk8s's Xid catalogue", "", False,
                                        "look the Xid up in NVIDIA's Xid catalogue "
                                        "(docs.nvidia.com/deploy/xid-errors)")


_RECOVERY = re.compile(r"to 0x[0-9a-fA-F]{1,8} \(([^)]{1,60})\)")


def recovery_action(e: XidEvent) -> str:
    """The recovery action an Xid 154 says the GPU now needs ('GPU Reset Required', 'Drain and Reset', 'Node Reboot
    Required'; the driver's 'GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)'), else ''."""
    m = _RECOVERY.search(e.text) if e.xid == 154 else None
    return "" if m is None or m.group(1) == "None" else m.group(1)


def is_fatal(e: XidEvent) -> bool:
    """The Xid needs a GPU reset or a reboot: NVIDIA's catalogue says so, or an Xid 154 names such an action."""
    return lookup(e.xid).fatal or bool(recovery_action(e))
