"""Phase driver: on GPU nodes with `driver: {manage: true}`, the NVIDIA driver that prepare installed is loaded and
its services run (docs/driver.md).

After prepare (playbooks/nvidia-driver.yaml: packages, holds, nouveau blacklisted in the initramfs) a node is in
one of three states: the installed module is loaded (nothing to do but start nvidia-persistenced and, on NVSwitch
systems, fabric manager); no module is loaded and nouveau is not either (`modprobe nvidia`, no reboot); or nouveau,
or a module of another version, holds the GPUs: a reboot. With --allow-reboot gpuk8s reboots the node and reads its
facts again (phases/reboot.py); without it the node is left out of the cluster phases, "needs reboot", with the
command. The measured seconds until the driver answered are in the report.
"""

from __future__ import annotations

import time

from gpuk8s.facts.model import HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Host
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult
from gpuk8s.phases.prepare import refresh_facts
from gpuk8s.phases.reboot import REBOOT, reboot
from gpuk8s.remote import for_each_host

LOAD = "modprobe nvidia && modprobe nvidia_uvm"


def services(f: HostFacts) -> list[str]:
    """The NVIDIA services a node runs once its module is loaded."""
    return ["nvidia-persistenced", *(["nvidia-fabricmanager"] if f.driver.nvswitches else [])]


def action(f: HostFacts) -> tuple[str, str]:
    """(what the node needs, why): ok, start (services), load, reboot, or failed."""
    d = f.driver
    want = d.libraries[-1] if d.libraries else None
    if want is None:
        return "failed", "no NVIDIA driver library is installed (the driver packages did not install)"
    nouveau = f.modules is not None and "nouveau" in f.modules
    if d.module_version == want and not nouveau:
        down = [s for s, st in zip(services(f), (d.persistenced, d.fabric_manager), strict=False) if st != "active"]
        return ("start", f"start {', '.join(down)}") if down else ("ok", f"driver {want} loaded")
    if d.module_version is None and not nouveau:
        return "load", f"driver {want} installed, no module loaded: {LOAD}"
    why = "nouveau holds the GPUs" if nouveau else f"module {d.module_version} is loaded, {want} is installed"
    return "reboot", why


class Driver(Phase):
    name = "driver"
    title = "NVIDIA driver loaded (driver: manage)"
    fatal = False

    @staticmethod
    def _hosts(ctx: Context) -> list[Host]:
        return [h for h in ctx.inv.hosts if h.gpu.driver.manage and is_gpu_node(h) and h.name in ctx.sessions
                and h.name in ctx.facts]

    def plan(self, ctx: Context) -> PhasePlan:
        changes = []
        for h in self._hosts(ctx):
            f = ctx.facts[h.name]
            what, why = action(f)
            if what == "load":
                changes.append(Change(why, h.name, f"{LOAD} && systemctl start {' '.join(services(f))}"))
            elif what == "start":
                changes.append(Change(why, h.name, f"systemctl start {' '.join(services(f))}"))
            elif what == "reboot":
                changes.append(Change(f"reboot ({why}){'' if ctx.options.allow_reboot else ': needs --allow-reboot'}",
                                      h.name, REBOOT))
        return self.planned("would-change" if changes else "unchanged",
                            "" if self._hosts(ctx) else "no node has driver: {manage: true}", changes)

    def _one(self, ctx: Context, h: Host) -> tuple[str, str]:
        f = ctx.facts[h.name]
        what, why = action(f)
        if what == "ok":
            return "unchanged", why
        if what == "failed":
            return "failed", why
        started = time.monotonic()
        if what == "reboot":
            if not ctx.options.allow_reboot:
                return "needs-reboot", f"{why}: reboot it ({REBOOT}) and re-run, or re-run with --allow-reboot"
            fresh, problem = reboot(ctx, h, why)
            if fresh is None:
                return "failed", problem
        else:
            cmd = f"{LOAD} && " if what == "load" else ""
            res = ctx.sessions[h.name].run(f"{cmd}systemctl start {' '.join(services(f))}", sudo=True, timeout=300,
                                           display=f"load the NVIDIA driver on {h.name}")
            if not res.ok:
                lines = (res.stderr or res.stdout).strip().splitlines()
                return "failed", f"{why}: {lines[-1][:300] if lines else f'exit status {res.exit_status}'}"
        got = refresh_facts({h.name: ctx.sessions[h.name]}, 1).get(h.name)
        if got is None:
            return "failed", "the facts could not be read again"
        ctx.put_facts(h.name, got)
        again, left = action(got)
        took = time.monotonic() - started
        if again != "ok":
            return "failed", f"{why}; afterwards still: {left}"
        return "changed", f"{why}; driver {got.driver.module_version} answers after {took:.0f} s" + (
            " (rebooted)" if what == "reboot" else "")

    def run(self, ctx: Context) -> PhaseResult:
        hosts = self._hosts(ctx)
        if not hosts:
            return self.result("unchanged", "no node has driver: {manage: true}")
        got = for_each_host(hosts, lambda h: self._one(ctx, h), ctx.concurrency)
        status: dict[str, tuple[str, str]] = {}
        for name, v in got.items():
            status[name] = ("failed", f"{type(v).__name__}: {v}") if isinstance(v, BaseException) else v
        bad = {n: s for n, s in status.items() if s[0] in ("failed", "needs-reboot")}
        changed = [n for n, s in status.items() if s[0] == "changed"]
        r = self.result("changed" if changed else "unchanged",
                        f"{len(status) - len(bad)} of {len(status)} node(s) with their driver loaded"
                        + (f" ({len(changed)} changed)" if changed else ""))
        r.hosts = {n: f"{s[0]}: {s[1]}" for n, s in status.items()}
        if bad:
            for n in bad:
                if n != ctx.cp.name and n in ctx.sessions:  # left out of the cluster phases, as prepare does
                    ctx.sessions.pop(n).close()
            r.status = "failed"
            r.message += "; " + "; ".join(f"{n}: {s[0]} ({s[1]})" for n, s in bad.items())
            r.remedy = ("reboot these nodes (or re-run with --allow-reboot), then re-run" if
                        any(s[0] == "needs-reboot" for s in bad.values()) else "see the log file, fix, re-run")
            r.stop = ctx.cp.name in bad
        return r
