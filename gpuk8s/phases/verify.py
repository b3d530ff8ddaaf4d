"""Phase verify: every node Ready and every resource of its GPU plan allocatable, then one test pod per GPU
node through the scheduler. The verdicts are decided by gpuk8s/kube/state.py from the cluster's JSON.
"""

from __future__ import annotations

import time

from gpuk8s.gpuplan import GPU_RESOURCE
from gpuk8s.kube import render, state
from gpuk8s.kube.state import DaemonSetState, NodeCheck, StateError
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult

TEST_NAMESPACE = "default"


def device_plugin(ctx: Context) -> DaemonSetState | None:
    found = ctx.kube.get("daemonset", state.DEVICE_PLUGIN, "kube-system")
    try:
        return state.daemonset_state(found[0]) if found else None
    except StateError:
        return None


def test_pod_name(node: str) -> str:
    return f"gpuk8s-verify-{node}"[:63]


class Verify(Phase):
    name = "verify"
    title = "verify every node and GPU"
    fatal = False

    def plan(self, ctx: Context) -> PhasePlan:
        gpu_nodes = [p.node for p in ctx.plans.values() if p.expected_gpus]
        changes = []
        if ctx.options.test_pods:
            changes = [Change(f"test pod on {n} (created, then deleted)", manifest=self._pod(ctx, n))
                       for n in gpu_nodes]
        return self.planned("would-change" if changes else "unchanged",
                            "every node Ready, every GPU of each node's plan allocatable" +
                            (", one nvidia-smi test pod per GPU node" if changes else ""), changes)

    def _pod(self, ctx: Context, node: str) -> str:
        f = ctx.facts.get(node)
        image = render.verify_image(ctx.inv, f.gpu.driver_release if f else None)
        return render.test_pod(test_pod_name(node), node, image)

    def run(self, ctx: Context) -> PhaseResult:
        nodes = state.by_name(ctx.kube.get("nodes"))
        pods = state.pod_states(ctx.kube.get("pods", namespace="*"))
        plugin = device_plugin(ctx)
        checks = []
        for h in ctx.inv.hosts:
            plan = ctx.plans[h.name]
            f = ctx.facts.get(h.name)
            runtime_default = None
            if f is not None:
                runtime_default = (f.containerd_config.default_runtime
                                   if ctx.inv.cluster.container_runtime == "containerd"
                                   else f.docker_daemon.default_runtime) or ""
            problem = (f.gpu.error or f.gpu.state) if f is not None and f.gpu.state != "ok" else ""
            checks.append(state.check_node(h.name, plan.resources.get(GPU_RESOURCE, 0), nodes.get(h.name), pods,
                                           plugin, driver_problem=problem, runtime_default=runtime_default))
        if ctx.options.test_pods:
            self._test_pods(ctx, [c for c in checks if c.ok and c.expected_gpus])
        ctx.nodes = checks
        bad = [c for c in checks if not c.ok]
        r = self.result("failed" if bad else "passed", state.summary(checks))
        if bad:
            r.remedy = "fix the named cause on each node, then run gpuk8s verify (or gpuk8s install) again"
        return r

    def _test_pods(self, ctx: Context, checks: list[NodeCheck]) -> None:
        """One pod per GPU node, all applied at once and polled together: a few kubectl calls in all."""
        if not checks:
            return
        for c in checks:
            c.pod = test_pod_name(c.node)
        names = [c.pod for c in checks]
        ctx.kube.delete("pod", names, TEST_NAMESPACE)
        ctx.kube.apply("---\n".join(self._pod(ctx, c.node) for c in checks))
        timeout = ctx.options.test_pod_timeout
        deadline = time.monotonic() + timeout
        waiting = {c.pod: c for c in checks}
        last: dict[str, str] = {}
        try:
            while waiting:
                pods = {p.name: p for p in state.pod_states(ctx.kube.get("pods", namespace=TEST_NAMESPACE))}
                for name, c in list(waiting.items()):
                    last[name] = state.pod_progress(pods.get(name))
                    verdict = state.test_pod_verdict(pods.get(name))
                    if verdict is None:
                        continue
                    c.ok, c.cause = verdict
                    c.cause_id = verdict.cause_id
                    del waiting[name]
                if not waiting:
                    break
                if time.monotonic() > deadline:
                    for name, c in waiting.items():
                        c.ok, c.cause = False, f"the test pod {name} did not finish within {timeout:g} s ({last[name]})"
                        c.cause_id = "gpu.test-pod-timeout"
                    break
                time.sleep(2)
        finally:
            ctx.kube.delete("pod", names, TEST_NAMESPACE)
