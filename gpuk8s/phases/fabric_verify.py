"""Phase fabric (`gpuk8s verify --fabric`, issue 43, docs/fabric.md): the RDMA fabric proven before nodes take jobs.

On every Ready node whose inventory sets `fabric:` (and verify found sound): one pod runs nccl-tests' all_reduce_perf
across all the node's GPUs, its bus bandwidth judged against the floor of its shape (gpuk8s/fabricplan.py); then the
nodes in a ring (each with the next), rail by rail (the n-th port of one node with the n-th of the next), one
perftest ib_write_bw server pod and one client pod per rail, each link's bandwidth judged against its ports' rate.
A port slow in both of its pairs is named on its node; a slow pair whose ends are fine elsewhere is named as the
link between them. The pods ask for the node's RDMA devices (the RDMA shared device plugin's resource) and IPC_LOCK,
run on the host's network (perftest exchanges its queue pairs over TCP to the peer node's address), and are deleted
afterwards. Each result is a finding with its numbers (`-o json`).

What it does not do yet: NCCL all-reduce across nodes (nccl-tests needs MPI for more than one process: a launcher
and workers, as the MPI Operator runs them).
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from gpuk8s import fabricplan, findings, mirrors, versions
from gpuk8s.fabricplan import FabricPlan, LinkReading
from gpuk8s.facts.fabric import classify_nccl, parse_all_reduce, parse_perftest
from gpuk8s.gpuplan import GPU_RESOURCE, QUARANTINE_KEY, RDMA_RESOURCE, quarantine_taint
from gpuk8s.kube import state
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult
from gpuk8s.phases.verify import TEST_NAMESPACE, _pod_name, foreign_names

PERFTEST_PORT = 18515  # perftest's default (src/perftest_parameters.h DEF_PORT); rail i listens on 18515 + i
PERFTEST_SECONDS = 5  # ib_write_bw -D: long enough for a steady rate, short enough for a fleet
NCCL_FROM = 128 << 20  # all_reduce_perf -b: sizes below the floor's size cost little and show the curve
NCCL_TO = 1 << 30  # -e where no floor names a size
NCCL = "/opt/nccl-tests/build/all_reduce_perf"  # in the test image (coreweave/nccl-tests' Dockerfile)
LOG_LINES = 400  # of a test pod's log: the whole table of either tool
QUARANTINED_FOR = "fabric."  # the quarantine taint's values this phase sets (and may lift)


def nccl_pod_name(node: str) -> str:
    return _pod_name("gpuk8s-fabric-nccl", node)


def rdma_pod_name(role: str, node: str, rail: int) -> str:
    return _pod_name(f"gpuk8s-fabric-{role}", node, str(rail))


def whole_gpus(ctx: Context, node: str) -> bool:
    """NCCL across a node's GPUs needs them whole: not shared, not MIG, not DRA (a test pod asks nvidia.com/gpu)."""
    p = ctx.plans.get(node)
    return p is not None and p.resource_name == GPU_RESOURCE and p.sharing == "none" and not p.dra \
        and p.mig_strategy == "none"


def _pod(ctx: Context, name: str, node: str, command: list[str], limits: dict[str, int],
         host_network: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE,
                     "labels": {"app.kubernetes.io/managed-by": "gpuk8s", "gpuk8s.io/proof": "fabric"}},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            **({"hostNetwork": True} if host_network else {}),
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "test", "image": mirrors.image(ctx.inv, versions.fabric().test_image), "command": command,
                "resources": {"limits": {k: v for k, v in limits.items()}},
                # RDMA pins memory: the runtime's default memlock limit (64 KiB or 8 MiB) is too small
                "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}],
        },
    }


def nccl_pod(ctx: Context, fp: FabricPlan) -> dict[str, Any]:
    floor = fabricplan.node_floor(fp)
    top = floor.size if floor else NCCL_TO
    cmd = [NCCL, "-b", str(min(NCCL_FROM, top)), "-e", str(top), "-f", "2", "-g", str(fp.gpus)]
    return _pod(ctx, nccl_pod_name(fp.node), fp.node, cmd, {GPU_RESOURCE: fp.gpus}, False)


def perftest_command(fp: FabricPlan, rail: int, server_ip: str | None) -> list[str]:
    p = fp.ports[rail]
    cmd = ["ib_write_bw", "-d", p.device, "-i", str(p.port), "-p", str(PERFTEST_PORT + rail), "-F",
           "--report_gbits", "-q", "4", "-D", str(PERFTEST_SECONDS)]
    if fp.gid_index is not None:  # RoCE: the RoCE v2 GID (perftest's -x; its default, index 0, is link-local v1)
        cmd += ["-x", str(fp.gid_index)]
    return cmd + ([server_ip] if server_ip else [])


class Pair:
    """One rail of one pair of nodes: the server's pod and the client's."""

    def __init__(self, client: FabricPlan, server: FabricPlan, rail: int) -> None:
        self.client, self.server, self.rail = client, server, rail
        self.server_pod = rdma_pod_name("srv", server.node, rail)
        self.client_pod = rdma_pod_name("cli", client.node, rail)

    def reading(self, gbps: float | None) -> LinkReading:
        a, b = self.client.ports[self.rail], self.server.ports[self.rail]
        return LinkReading(self.client.node, self.server.node, a.device, b.device, gbps,
                           fabricplan.link_floor(a.rate, b.rate))


def pairs(fps: dict[str, FabricPlan]) -> list[Pair]:
    """Every rail of every ring pair: the n-th port of one node with the n-th of the next (a node with fewer
    ports tests only those it has)."""
    out = []
    for a, b in fabricplan.ring(sorted(fps)):
        for rail in range(min(len(fps[a].ports), len(fps[b].ports))):
            out.append(Pair(fps[a], fps[b], rail))
    return out


def internal_ip(node: Any) -> str | None:
    for a in (node.get("status", {}).get("addresses") or []) if isinstance(node, dict) else []:
        if isinstance(a, dict) and a.get("type") == "InternalIP" and isinstance(a.get("address"), str):
            return a["address"]
    return None


class FabricVerify(Phase):
    name = "fabric"
    title = "prove the RDMA fabric: NCCL across each node's GPUs, RDMA between nodes"
    fatal = False

    def _targets(self, ctx: Context) -> dict[str, FabricPlan]:
        """The fabric nodes verify found sound (all fabric nodes where verify did not run): a node in quarantine
        for its fabric (fabric.*) is tested again, one in quarantine for its GPUs is not."""
        fps = fabricplan.plans(ctx.inv.hosts, ctx.facts)
        if ctx.nodes:
            sound = {c.node for c in ctx.nodes if c.ready and (
                (c.ok and not c.quarantine) or c.quarantine.startswith(QUARANTINED_FOR))}
            fps = {n: p for n, p in fps.items() if n in sound}
        return {n: p for n, p in fps.items() if p.ports}

    def plan(self, ctx: Context) -> PhasePlan:
        fps = self._targets(ctx)
        changes = [Change(f"NCCL all-reduce across the {fp.gpus} GPUs of {n} (created, then deleted)",
                          manifest=yaml.safe_dump(nccl_pod(ctx, fp), sort_keys=False))
                   for n, fp in sorted(fps.items()) if whole_gpus(ctx, n)]
        for pr in pairs(fps):
            changes.append(Change(f"RDMA write {pr.client.node} {pr.client.ports[pr.rail].device} -> "
                                  f"{pr.server.node} {pr.server.ports[pr.rail].device} (two pods, then deleted)",
                                  manifest=yaml.safe_dump(_pod(ctx, pr.client_pod, pr.client.node,
                                                               perftest_command(pr.client, pr.rail, "SERVER-IP"),
                                                               {RDMA_RESOURCE: 1}, True), sort_keys=False)))
        if not changes:
            return self.planned("unchanged", "no fabric node to test")
        return self.planned("would-change", "the fabric's test pods", changes)

    def run(self, ctx: Context) -> PhaseResult:
        started = time.monotonic()
        fps = self._targets(ctx)
        if not fps:
            return self.result("skipped", "no fabric node to test (inventory fabric:, Ready, sound)")
        nodes = state.by_name(ctx.kube.get("nodes"))
        nccl = {n: nccl_pod(ctx, fp) for n, fp in sorted(fps.items()) if whole_gpus(ctx, n)}
        prs = pairs(fps)
        servers = {pr.server_pod: _pod(ctx, pr.server_pod, pr.server.node, perftest_command(pr.server, pr.rail, None),
                                       {RDMA_RESOURCE: 1}, True) for pr in prs}
        clients: dict[str, dict[str, Any]] = {}
        for pr in prs:
            ip = internal_ip(nodes.get(pr.server.node))
            if ip:
                clients[pr.client_pod] = _pod(ctx, pr.client_pod, pr.client.node,
                                              perftest_command(pr.client, pr.rail, ip), {RDMA_RESOURCE: 1}, True)
        names = [*(d["metadata"]["name"] for d in nccl.values()), *servers, *clients]
        foreign = foreign_names(ctx, [("Pod", n, TEST_NAMESPACE) for n in names])
        if foreign:
            return self.result("failed", f"pods of gpuk8s's names exist that gpuk8s did not create: "
                               f"{', '.join(sorted(foreign)[:5])}", "delete or rename them, then verify again")
        logs: dict[str, str] = {}
        phases: dict[str, str] = {}
        ctx.kube.delete("pod", names, TEST_NAMESPACE)
        try:
            first = [*nccl.values(), *servers.values()]
            if first:
                ctx.kube.apply("---\n".join(yaml.safe_dump(d, sort_keys=False) for d in first))
            # the clients once their servers listen (a client fails at once where none does)
            up = self._wait(ctx, list(servers), lambda p: p.phase != "Pending", ctx.options.fabric_timeout)
            ready = {pr.client_pod for pr in prs if up.get(pr.server_pod) == "Running" and pr.client_pod in clients}
            if ready:
                ctx.kube.apply("---\n".join(yaml.safe_dump(clients[n], sort_keys=False) for n in sorted(ready)))
            watch = [*(d["metadata"]["name"] for d in nccl.values()), *sorted(ready)]
            phases = self._wait(ctx, watch, lambda p: p.phase in ("Succeeded", "Failed"),
                                max(0.0, ctx.options.fabric_timeout - (time.monotonic() - started)))
            phases.update({n: up.get(n, "") for n in servers})
            for n in watch:
                if phases.get(n) in ("Succeeded", "Failed"):
                    logs[n] = ctx.kube.logs(n, TEST_NAMESPACE, tail=LOG_LINES)
        finally:
            ctx.kube.delete("pod", names, TEST_NAMESPACE)
        found, slow_ports = self._judge(ctx, fps, nccl, prs, phases, logs)
        ctx.findings.extend(found)
        took = time.monotonic() - started
        bad = [f for f in found if f.status == "fail"]
        r = self.result("failed" if bad else "passed",
                        f"{len(fps)} node(s), {len(prs)} link(s) tested in {took:.0f} s" +
                        (f"; {len(bad)} finding(s) failed" if bad else ""))
        if bad:
            r.remedy = "each failed finding names the node, the port and its numbers (gpuk8s verify --fabric -o json)"
        if ctx.options.fabric_quarantine:
            self._quarantine(ctx, fps, found, slow_ports, r)
        return r

    @staticmethod
    def _quarantine(ctx: Context, fps: dict[str, FabricPlan], found: list[findings.Finding], slow_ports: set[str],
                    r: PhaseResult) -> None:
        """--quarantine: a node whose GPUs failed NCCL's floor, or whose port is slow in every pair, gets the
        quarantine taint health uses (value: the finding); a node in quarantine for its fabric that passed every
        fabric test now is released. A slow link whose ends are fine elsewhere taints neither end."""
        was = {c.node: c.quarantine for c in ctx.nodes}
        for node in sorted(fps):
            mine = [f for f in found if f.subject is not None and f.subject.name == node]
            nccl_bad = any(f.id == "fabric.nccl" and f.status == "fail" for f in mine)
            why = "fabric.nccl" if nccl_bad else "fabric.rdma" if node in slow_ports else ""
            now = was.get(node, "")
            if why and not now:
                ctx.kube.taint(node, [str(quarantine_taint(why))])
                r.hosts[node] = f"quarantined ({why})"
            elif not why and now.startswith(QUARANTINED_FOR) and any(f.status == "pass" for f in mine) and all(
                    f.status in ("pass", "skip") for f in mine):
                ctx.kube.taint(node, [f"{QUARANTINE_KEY}:NoSchedule-"])
                r.hosts[node] = f"released: every fabric test passed (it was quarantined for {now})"

    @staticmethod
    def _wait(ctx: Context, names: list[str], done: Any, timeout: float) -> dict[str, str]:
        """Poll the pods until each is done(pod) or the timeout; each one's last phase ('' where not seen)."""
        deadline = time.monotonic() + timeout
        while True:
            pods = {p.name: p for p in state.pod_states(ctx.kube.get("pods", namespace=TEST_NAMESPACE))
                    if p.name in names}
            if all(n in pods and done(pods[n]) for n in names) or time.monotonic() > deadline:
                return {n: (pods[n].phase if n in pods else "") for n in names}
            time.sleep(1)

    @staticmethod
    def _judge(ctx: Context, fps: dict[str, FabricPlan], nccl: dict[str, dict[str, Any]], prs: list[Pair],
               phases: dict[str, str], logs: dict[str, str]) -> tuple[list[findings.Finding], set[str]]:
        """The findings, and the nodes with a port slow in every pair (fabricplan.culprits)."""
        out = []
        readings = {n: parse_all_reduce(logs.get(nccl_pod_name(n), "")) for n in nccl}
        measured = {n: fabricplan.busbw_at(r, fabricplan.node_floor(fps[n])) for n, r in readings.items()}
        for n in nccl:
            out.append(fabricplan.judge_node(fps[n], readings[n], measured, fps, phases.get(nccl_pod_name(n), ""),
                                             classify_nccl(logs.get(nccl_pod_name(n), "")))
                       .about(findings.node(n)))
        for n in sorted(set(fps) - set(nccl)):
            out.append(findings.skipped("fabric.nccl", "not tested: the node's GPUs are shared, MIG or DRA (NCCL "
                                        "across a node needs its GPUs whole)", subject=findings.node(n)))
        link_readings = []
        failed: dict[tuple[str, str], str] = {}
        for pr in prs:
            text = logs.get(pr.client_pod, "")
            res = parse_perftest(text)
            link_readings.append(pr.reading(res.average if res else None))
            if res is None:
                why = phases.get(pr.client_pod) or f"its server {phases.get(pr.server_pod) or 'never started'}"
                last = " / ".join(ln.strip() for ln in text.strip().splitlines()[-2:])[:300]
                failed[(pr.client.node, pr.client.ports[pr.rail].device)] = (
                    f"RDMA write to {pr.server.node} {pr.server.ports[pr.rail].device} did not run ({why}"
                    + (f": {last}" if last else "") + ")")
        out += fabricplan.judge_links(link_readings, failed, sorted(fps))
        return out, fabricplan.culprits(link_readings)
