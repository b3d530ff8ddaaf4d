"""Phase driver-upgrade (`gpuk8s driver upgrade`): every node with `driver: {manage: true}` brought to the driver its
inventory says (the branch and modules gpuk8s/driver/rules.py chooses), node by node or N at a time.

Per node, as `gpuk8s upgrade` moves kubelets: cordoned (marked, so that a stopped run is finished by the next), its
GPU pods named and waited for (never killed), drained; the new driver's packages installed and held
(playbooks/nvidia-driver.yaml, with fabric manager of the same branch on NVSwitch systems); the node rebooted, which
stops every GPU user (device plugin, DCGM exporter, MPS daemon hold the device files) and loads the new module; its
facts read again and the driver checked; its GPUs waited for until the kubelet advertises them; uncordoned. The
report gives each node's GPU-down seconds (from the reboot to its GPUs allocatable again). Nodes already at their
driver are skipped: a re-run resumes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuk8s import findings
from gpuk8s.bundle.coverage import host_gaps
from gpuk8s.driver import rules
from gpuk8s.facts.model import HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.install.prepare import HostRun, run_steps
from gpuk8s.inventory.model import Host
from gpuk8s.phases import nodeops
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult
from gpuk8s.phases.driver import action
from gpuk8s.phases.nodeops import NodeFailure, NodeOptions, NodeOutcome
from gpuk8s.phases.prepare import refresh_facts
from gpuk8s.phases.reboot import REBOOT, reboot
from gpuk8s.phases.verify import wait_offered
from gpuk8s.playbook.model import load_playbook
from gpuk8s.playbook.render import RenderedStep, context, render_playbook


def wanted(h: Host, f: HostFacts) -> dict[str, object]:
    """The driver the node's inventory asks for (playbooks/nvidia-driver.yaml's `driver`)."""
    return rules.playbook_context(h.gpu.driver, f)


def at_target(f: HostFacts, want: dict[str, object]) -> bool:
    """Whether the node runs the wanted branch and modules, loaded, with its libraries and services."""
    d = f.driver
    return (bool(want.get("manage")) and d.module_version is not None
            and d.module_version.split(".")[0] == want["branch"] and d.module_flavor == want["flavor"]
            and action(f)[0] == "ok")


class DriverUpgrade(Phase):
    name = "driver-upgrade"
    title = "upgrade the NVIDIA driver node by node"
    resume = "gpuk8s driver upgrade"
    mark = "driver-upgrade"  # its cordon mark: a node a stopped upgrade or allocator move left is not its to finish

    def __init__(self, opts: NodeOptions, on_node: Callable[[str, float], None] | None = None) -> None:
        self.opts = opts
        self.on_node = on_node or (lambda name, seconds: None)
        self.gpu_down: dict[str, float] = {}

    @staticmethod
    def _managed(ctx: Context) -> list[Host]:
        return [h for h in ctx.inv.hosts if h.gpu.driver.manage and is_gpu_node(h)]

    def _steps(self, ctx: Context, h: Host) -> list[RenderedStep]:
        c = context(ctx.inv, h, ctx.facts[h.name])
        return render_playbook(load_playbook("nvidia-driver"), c)

    def plan(self, ctx: Context) -> PhasePlan:
        changes: list[Change] = []
        todo = []
        marked = nodeops.marked(ctx.kube, self.mark)
        for h in self._managed(ctx):
            f = ctx.facts.get(h.name)
            if f is None:
                continue
            want = wanted(h, f)
            if not want.get("manage"):
                continue
            if at_target(f, want):
                if h.name in marked:
                    todo.append(h.name)
                    changes += [Change(f"{h.name} is at driver {f.driver.module_version}, left cordoned by an earlier "
                                       "run: wait for its GPUs, then uncordon", "", f"kubectl uncordon {h.name}")]
                continue
            refused = self._not_in_bundle(ctx, h, f)
            if refused:
                changes.append(Change(f"{refused}: {h.name} is left as it was", h.name))
                continue
            todo.append(h.name)
            have = f.driver.module_version or "none"
            pods = nodeops.gpu_pods(ctx.kube, h.name)
            if pods:
                changes.append(Change(f"GPU pods on {h.name} waited for: {', '.join(pods)}"))
            # what _node_upgrade does, in its order: drain, the driver's steps, the reboot, the uncordon
            changes.append(nodeops.drain_change(h.name, self.opts))
            changes += [Change(f"{s.playbook}/{s.name}: {s.title}", h.name, s.run) for s in self._steps(ctx, h)]
            changes.append(Change(f"reboot {h.name} into driver {want['branch']} ({want['flavor']}), from {have}",
                                  h.name, REBOOT))
            changes.append(Change(f"wait until {h.name}'s GPUs are offered again", ""))
            changes.append(nodeops.uncordon_change(h.name))
        held_back = [c.host for c in changes if c.what.endswith("is left as it was")]
        if held_back and not todo:  # the run fails these nodes (bundle.coverage) and changes none
            return self.planned("unknown", f"the bundle lacks the driver of {', '.join(held_back)}", changes)
        if not todo:
            return self.planned("unchanged", "every managed node runs the driver its inventory asks for")
        return self.planned("would-change", f"{len(todo)} node(s) to upgrade ({', '.join(todo)}), "
                            f"{self.opts.max_unavailable} at a time", changes)

    @staticmethod
    def _not_in_bundle(ctx: Context, h: Host, f: HostFacts) -> str:
        """--bundle: why the bundle cannot serve the node's new driver ("" where it can, or without a bundle); the
        one check the plan shows and the run applies, before the node is drained."""
        if ctx.bundle is None:
            return ""
        gaps = host_gaps(ctx.bundle, ctx.inv, h, f)
        return gaps[0].message if gaps else ""

    def _node_upgrade(self, ctx: Context, h: Host) -> NodeOutcome:
        if ctx.lock_lost:  # another node's reboot (the first control plane's) lost the cluster lock: no more nodes
            raise NodeFailure("driver.upgrade-failed", f"{h.name}: not started: {ctx.lock_lost}",
                              f"re-run {self.resume} once the other run has finished")
        t0 = time.monotonic()
        f = ctx.facts[h.name]
        want = wanted(h, f)
        have = f.driver.module_version or "none"
        refused = self._not_in_bundle(ctx, h, f)
        if refused:
            raise NodeFailure("bundle.coverage", f"{refused}: {h.name} was left as it was",
                              f"build a bundle with this inventory (gpuk8s bundle create), then re-run {self.resume} "
                              "with it")
        emit = ctx.emit
        mine, waited = nodeops.vacate(ctx.kube, h.name, self.mark, self.opts, emit, self.resume,
                                      "driver.upgrade-failed")
        run = HostRun(h)
        run_steps(ctx.sessions[h.name], run, self._steps(ctx, h), False, lambda e: None)
        if run.status != "done":
            raise NodeFailure("driver.upgrade-failed", f"{h.name}: the driver packages: {run.message}",
                              f"{run.remedy}; the node stays drained and cordoned; re-run {self.resume}")
        down = time.monotonic()
        fresh, problem = reboot(ctx, h, f"driver {have} -> {want['branch']}")
        if fresh is None:
            raise NodeFailure("driver.upgrade-failed", f"{h.name}: {problem}", f"then re-run {self.resume}")
        got = refresh_facts({h.name: fresh}, 1).get(h.name)
        if got is None or not at_target(got, want):
            left = action(got)[1] if got is not None else "its facts could not be read"
            raise NodeFailure("driver.upgrade-failed", f"{h.name} came back without driver {want['branch']}: {left}",
                              f"see gpuk8s preflight on {h.name}; the node stays cordoned; re-run {self.resume}")
        ctx.put_facts(h.name, got)
        self._wait_gpus(ctx, h)
        gpu_down = time.monotonic() - down
        self.gpu_down[h.name] = gpu_down
        back = nodeops.left_as_it_was(ctx.kube, h.name, mine)
        seconds = time.monotonic() - t0
        self.on_node(h.name, seconds)
        emit(f"{h.name}: driver {have} -> {got.driver.module_version} in {seconds:.1f} s (GPUs down {gpu_down:.1f} s)")
        self.opts.findings.append(findings.passed(
            "driver.upgraded", f"{h.name} runs driver {got.driver.module_version} ({want['flavor']})",
            subject=findings.node(h.name)))
        return NodeOutcome("done", "; ".join([
            *([f"waited for GPU pods {', '.join(waited)}"] if waited else []), "drained",
            f"driver {have} -> {got.driver.module_version} ({want['flavor']}, held)", "rebooted",
            f"GPUs back after {gpu_down:.1f} s", back]))

    def _wait_gpus(self, ctx: Context, h: Host) -> None:
        """Until the node's allocator offers its GPUs again (verify.offered: the plan's resources, or on a dra node
        the devices of its ResourceSlice)."""
        plan = ctx.plans.get(h.name)
        if plan is None:
            return
        ok, what = wait_offered(ctx, plan, self.opts.drain_timeout, self.opts.poll)
        if not ok:
            raise NodeFailure("driver.upgrade-failed", f"{h.name}: its GPUs were not advertised again within "
                              f"{self.opts.drain_timeout} s after the reboot ({what})",
                              f"gpuk8s doctor node/{h.name}; the node stays cordoned; re-run {self.resume}")

    def _resume(self, ctx: Context, h: Host) -> NodeOutcome:
        """A node at its driver that an earlier run left cordoned (stopped after the reboot: Ctrl-C, a lost
        connection, GPUs late, the API away): its GPUs waited for as after a reboot, then uncordoned."""
        f = ctx.facts[h.name]
        self._wait_gpus(ctx, h)
        return NodeOutcome("resumed", f"already at driver {f.driver.module_version}; GPUs offered; "
                           f"{nodeops.give_back(ctx.kube, h.name)} (an earlier run stopped before it)")

    def run(self, ctx: Context) -> PhaseResult:
        out: dict[str, NodeOutcome] = {}
        todo: list[Host] = []
        resumed: list[Host] = []
        marked = nodeops.marked(ctx.kube, self.mark)
        for h in self._managed(ctx):
            f = ctx.facts.get(h.name)
            if h.name not in ctx.sessions or f is None:
                why = ctx.unreachable.get(h.name) or ("its facts could not be read" if h.name in ctx.sessions
                                                      else "no SSH session")
                out[h.name] = nodeops.unreachable(self.opts, h.name, "driver.upgrade-failed",
                                                  f"{why}; a host rebooting answers again once it is up", self.resume)
                continue
            want = wanted(h, f)
            if not want.get("manage"):
                out[h.name] = NodeOutcome("failed", "its driver settings do not work on it (gpuk8s preflight: "
                                          "driver.plan)")
            elif at_target(f, want):
                if h.name in marked:
                    resumed.append(h)  # an earlier run stopped after its reboot: finished below, not left cordoned
                else:
                    out[h.name] = NodeOutcome("already", f"already at driver {f.driver.module_version} "
                                              f"({want['flavor']})")
            else:
                todo.append(h)
        resuming = {h.name for h in resumed}
        out.update(nodeops.each_node([*resumed, *todo], lambda h: self._resume(ctx, h) if h.name in resuming
                                     else self._node_upgrade(ctx, h), self.opts, "driver.upgrade-failed",
                                     self.resume))

        def changed(done: list[str], finished: list[str]) -> str:
            said = (f"upgraded {len(done)} node(s); GPUs down per node: "
                    + ", ".join(f"{n} {self.gpu_down[n]:.1f} s" for n in done) if done
                    else "every managed node runs the driver its inventory asks for")
            if finished:
                said += f"; resumed: {', '.join(finished)} uncordoned (an earlier run stopped after its reboot)"
            return said

        if not out:
            return self.result("unchanged", "no node has driver: {manage: true}")
        return nodeops.node_result(
            self, out, remedy=f"fix the cause, then re-run {self.resume}: upgraded nodes are skipped",
            unchanged="every managed node runs the driver its inventory asks for", changed=changed)
