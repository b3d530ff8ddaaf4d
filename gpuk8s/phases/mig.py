"""Phase mig: partition each node's GPUs as its inventory `mig:` asks, over SSH, kept across reboots.

Per host: the GPU plan's layout (inventory `mig.config`) is resolved against every GPU's profile table
(gpuk8s/mig), compared with the MIG state the probe read (gpuk8s/facts/mig.py), and only the GPUs that
differ are changed by playbooks/cluster/mig-apply.sh (destroy, set the mode, reset, create). The same
script installs /etc/gpuk8s/mig.conf, /usr/local/sbin/gpuk8s-mig (playbooks/cluster/mig-boot.sh) and the
oneshot unit gpuk8s-mig.service that re-creates the instances at boot. A GPU whose reset is refused (a
process holds it, or the platform cannot reset) leaves its host "needs reboot" with the command to run;
the other hosts and GPUs complete; with --allow-reboot (Options.allow_reboot) gpuk8s reboots that host
itself (`sudo systemctl reboot`), waits until SSH goes away and answers again (bounded by
Options.reboot_timeout), reads its facts again and applies what the boot unit left to do. Going back to
`strategy: none` destroys the instances, turns MIG off and removes the unit. Listed in gpuk8s/flows.py
right after prepare, so that the device plugin starts on the final layout; the GPU plans are re-made from
the facts read after the change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpuk8s.facts.model import HostFacts
from gpuk8s.inventory.model import Host
from gpuk8s.mig import layout as L
from gpuk8s.mig.profiles import mig_capable, model_for
from gpuk8s.phases import shell
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult
from gpuk8s.phases.prepare import refresh_facts
from gpuk8s.phases.reboot import REBOOT, reboot
from gpuk8s.remote import Session, for_each_host

UNIT = """[Unit]
Description=gpuk8s: re-create the MIG layout of /etc/gpuk8s/mig.conf (GPU instances do not survive a reboot)
After=nvidia-persistenced.service
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/gpuk8s-mig /etc/gpuk8s/mig.conf

[Install]
WantedBy=multi-user.target
"""


@dataclass
class HostMig:
    """What one host needs: the GPU changes of the diff, the boot layout, or why it cannot be planned."""

    host: Host
    changes: list[L.GPUChange] = field(default_factory=list)
    unchanged: list[int] = field(default_factory=list)
    conf: str = ""
    persist: bool = False
    error: str = ""
    remedy: str = ""

    def script(self) -> str:
        return shell.command("mig-apply", **self.values())

    def values(self) -> dict[str, object]:
        rows = [{"index": c.index, "mode": "-" if c.mode is None else c.mode, "destroy": "yes" if c.destroy else "no",
                 "create": ",".join(c.create) or "-"} for c in self.changes]
        return {"persist": "yes" if self.persist else "no", "conf": self.conf, "program": shell.command("mig-boot"),
                "unit": UNIT, "changes": rows}


def gpu_states(facts: HostFacts) -> dict[int, L.GPUState]:
    return {g.index: L.state_of(g) for g in facts.mig.gpus}


def has_mig(facts: HostFacts) -> bool:
    """Whether any GPU is, or will be after a reset, in MIG mode (then `strategy: none` has work to do)."""
    return any("Enabled" in (g.current, g.pending) or g.instances for g in facts.mig.gpus)


def host_plan(host: Host, facts: HostFacts) -> HostMig:
    """The diff of one host (pure): its GPUs against the inventory's layout."""
    s = host.gpu.mig
    hm = HostMig(host, persist=s.enabled)
    if facts.mig.state != "ok":
        hm.error = f"cannot read the MIG state: {facts.mig.error or facts.mig.state}"
        hm.remedy = "check nvidia-smi on the host (gpuk8s preflight shows the driver's state)"
        return hm
    states = gpu_states(facts)
    conf = ["# written by gpuk8s (docs/mig.md): INDEX on PROFILES | INDEX off"]
    for gpu in facts.gpu.gpus:
        model = model_for(gpu.name, gpu.memory_mib)
        try:
            want = L.wanted(s.layout, gpu.index, model, gpu.name) if s.enabled and s.layout else None
        except L.LayoutError as e:
            hm.error, hm.remedy = f"GPU {gpu.index}: {e.message}", e.fix
            if not mig_capable(gpu.name):
                hm.error = f"GPU {gpu.index}: MIG requested on a GPU without MIG ({gpu.name})"
                hm.remedy = "remove mig from this host (or its group), or use gpu_sharing: time-slicing"
            return hm
        state = states.get(gpu.index, L.GPUState(gpu.index, "[N/A]", "[N/A]"))
        ch = L.diff(state, want, model)
        (hm.changes.append(ch) if ch.status == "change" else hm.unchanged.append(gpu.index))
        order = (L.creation_order(model, want) if model is not None and want else ()) or ()
        conf.append(f"{gpu.index} on {','.join(order)}" if want is not None else f"{gpu.index} off")
    hm.conf = "\n".join(conf) + "\n"
    return hm


def targets(ctx: Context) -> list[HostMig]:
    """Every reachable host that asks for MIG, or has MIG on and must go back to none."""
    out = []
    for name, facts in sorted(ctx.facts.items()):
        if name not in ctx.sessions:
            continue
        host = ctx.inv.host(name)
        if host.gpu.mig.enabled or has_mig(facts):
            out.append(host_plan(host, facts))
    return out


def parse_result(stdout: str) -> tuple[bool, dict[int, tuple[str, str]]]:
    """The script's lines: (files changed, {gpu: (status, detail)})."""
    files = False
    gpus: dict[int, tuple[str, str]] = {}
    for line in stdout.splitlines():
        words = line.split(" ", 4)
        if words[:2] == ["@@gpuk8s-mig", "files"] and len(words) >= 3:
            files = words[2] == "changed"
        elif words[:2] == ["@@gpuk8s-mig", "gpu"] and len(words) >= 4 and words[2].isdigit():
            gpus[int(words[2])] = (words[3], words[4] if len(words) > 4 else "")
    return files, gpus


class Mig(Phase):
    name = "mig"
    title = "MIG partitions"
    fatal = False

    def plan(self, ctx: Context) -> PhasePlan:
        plans = targets(ctx)
        if not plans:
            return self.planned("unchanged", "no host asks for MIG or has it on")
        changes, bad = [], []
        for hm in plans:
            if hm.error:
                bad.append(f"{hm.host.name}: {hm.error}")
                continue
            if hm.changes:
                what = "; ".join(f"GPU {c.index}: {c.reason}" for c in hm.changes)
                changes.append(Change(f"MIG on {hm.host.name}: {what}", hm.host.name, hm.script()))
        return self.planned("would-change" if changes else "unchanged",
                            "; ".join(bad) if bad else "every GPU as its layout asks" if not changes else "",
                            changes)

    def run(self, ctx: Context) -> PhaseResult:
        plans = targets(ctx)
        if not plans:
            r = self.result("unchanged", "no host asks for MIG or has it on")
            return r

        def apply(hm: HostMig) -> tuple[str, str]:
            if hm.error:
                return "failed", f"{hm.error} ({hm.remedy})"
            s: Session = ctx.sessions[hm.host.name]
            res = s.run(shell.command("mig-apply", **hm.values()), sudo=True, timeout=900,
                        display=f"mig-apply ({len(hm.changes)} GPU(s) to change)")
            files, gpus = parse_result(res.stdout)
            if not res.ok:
                return "failed", f"mig-apply exit status {res.exit_status}: {res.stderr.strip()[:300]}"
            reboot = [f"GPU {i} ({d})" for i, (st, d) in sorted(gpus.items()) if st == "needs-reboot"]
            failed = [f"GPU {i}: {d}" for i, (st, d) in sorted(gpus.items()) if st == "failed"]
            missing = [c.index for c in hm.changes if c.index not in gpus]
            if failed or missing:
                return "failed", "; ".join(failed + [f"GPU {i}: no result" for i in missing])
            if reboot and ctx.options.allow_reboot:
                return self._reboot(ctx, hm, ", ".join(reboot))
            if reboot:
                return "needs-reboot", (f"the GPU reset was refused on {', '.join(reboot)}: reboot the host "
                                        f"({REBOOT}), or re-run with --allow-reboot; gpuk8s-mig.service "
                                        "re-creates the layout at boot")
            done = [i for i, (st, _d) in gpus.items() if st == "changed"]
            if done or files:
                return "changed", (f"GPU {', '.join(map(str, sorted(done)))} changed" if done else
                                   "boot layout written") + (f"; GPU {', '.join(map(str, hm.unchanged))} unchanged"
                                                             if hm.unchanged else "")
            return "unchanged", "every GPU as its layout asks"

        got = for_each_host([hm.host for hm in plans], lambda h: apply(next(p for p in plans if p.host is h)),
                            ctx.concurrency)
        r = self.result("unchanged")
        for hm in plans:
            v = got.get(hm.host.name)
            status, detail = v if isinstance(v, tuple) else ("failed", str(v)[:300])
            r.hosts[hm.host.name] = f"{status}: {detail}"
        statuses = [r.hosts[h.host.name].split(":", 1)[0] for h in plans]
        self._refresh(ctx, [h.host.name for h, st in zip(plans, statuses, strict=True) if st != "unchanged"])
        if any(st in ("failed", "needs-reboot") for st in statuses):
            r.status = "failed"
            reboot = [h.host.name for h, st in zip(plans, statuses, strict=True) if st == "needs-reboot"]
            failed = [h.host.name for h, st in zip(plans, statuses, strict=True) if st == "failed"]
            r.message = "; ".join(x for x in (
                f"needs a reboot: {', '.join(reboot)}" if reboot else "",
                f"failed: {', '.join(failed)}" if failed else "") if x)
            r.remedy = (f"reboot {', '.join(reboot)} ({REBOOT}), then re-run; " if reboot else "") + \
                "see each host's line above"
        elif "changed" in statuses:
            r.status = "changed"
            r.message = f"{statuses.count('changed')} host(s) changed"
        else:
            r.message = "every GPU as its layout asks"
        return r

    @staticmethod
    def _refresh(ctx: Context, names: list[str]) -> None:
        """The facts after the change, and the GPU plans made from them, for the phases after this one."""
        if names:
            ctx.set_facts({**ctx.facts, **refresh_facts({n: ctx.sessions[n] for n in names}, ctx.concurrency)})

    @staticmethod
    def _reboot(ctx: Context, hm: HostMig, why: str) -> tuple[str, str]:
        """--allow-reboot: reboot the host, wait for SSH to go and to come back, then finish what the boot unit
        did not (gpuk8s-mig.service normally creates the whole layout at boot)."""
        host = hm.host
        started = time.monotonic()
        fresh, problem = reboot(ctx, host, why)
        if fresh is None:
            return "failed", problem
        facts = refresh_facts({host.name: fresh}, 1).get(host.name)
        if facts is None:
            return "failed", f"{host.name} came back after the reboot, but its facts could not be read"
        ctx.put_facts(host.name, facts)
        again = host_plan(host, facts)
        took = f"rebooted ({why}; SSH back after {time.monotonic() - started:.0f} s)"
        if again.error:
            return "failed", f"{took}; {again.error} ({again.remedy})"
        if not again.changes:
            return "changed", f"{took}; gpuk8s-mig.service created the layout"
        res = fresh.run(again.script(), sudo=True, timeout=900, display="mig-apply (after the reboot)")
        _files, gpus = parse_result(res.stdout)
        bad = [f"GPU {i}: {st} {d}".strip() for i, (st, d) in sorted(gpus.items())
               if st not in ("changed", "unchanged")]
        if not res.ok or bad:
            return "failed", f"{took}; " + ("; ".join(bad) or f"mig-apply exit status {res.exit_status}")
        return "changed", f"{took}; GPU {', '.join(str(c.index) for c in again.changes)} changed after it"
