"""Phase fabric (`gpuk8s verify --fabric`, issue 43, docs/fabric.md): the RDMA fabric proven before nodes take jobs.

On every Ready node whose inventory sets `fabric:` (and verify found sound): one pod runs nccl-tests' all_reduce_perf
across all the node's GPUs, its bus bandwidth judged against the floor of its shape (gpuk8s/fabricplan.py); then the
nodes in a ring (each with the next), rail by rail (the n-th port of one node with the n-th of the next), one
perftest ib_write_bw server pod and one client pod per rail, each link's bandwidth judged against its ports' rate.
A port slow in both of its pairs is named on its node; a slow pair whose ends are fine elsewhere is named as the
link between them. The pods ask for the node's RDMA devices (the RDMA shared device plugin's resource) and IPC_LOCK,
run on the host's network (perftest exchanges its queue pairs over TCP to the peer node's address), and are deleted
afterwards. Each result is a finding with its numbers (`-o json`).

Then, once those pods are gone (they hold the GPUs and the links), NCCL all-reduce across the GPUs of two nodes for
each pair of a ring of the nodes with whole GPUs (phases/fabric_nccl.py: sshd workers and an mpirun launcher, as the
MPI Operator runs nccl-tests).
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from gpuk8s import fabricplan, findings
from gpuk8s.fabricplan import FabricPlan, LinkReading
from gpuk8s.facts.fabric import RdmaPort, classify_nccl, parse_all_reduce, parse_perftest
from gpuk8s.gpuplan import GPU_RESOURCE, QUARANTINE_KEY, RDMA_RESOURCE, quarantine_taint
from gpuk8s.kube import state
from gpuk8s.kube.state import StateError
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult
from gpuk8s.phases.fabric_nccl import PairRun, plan_changes, ring_pairs
from gpuk8s.phases.fabric_pods import leftovers, over, test_pod, unschedulable
from gpuk8s.phases.poll import until
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


def _top(fp: FabricPlan) -> int:
    """The size a node's own all-reduce runs up to: its published floor's, else NCCL_TO."""
    floor = fabricplan.node_floor(fp)
    return floor.size if floor else NCCL_TO


def nccl_pod(ctx: Context, fp: FabricPlan) -> dict[str, Any]:
    top = _top(fp)
    cmd = [NCCL, "-b", str(min(NCCL_FROM, top)), "-e", str(top), "-f", "2", "-g", str(fp.gpus)]
    return test_pod(ctx, nccl_pod_name(fp.node), fp.node, cmd, {GPU_RESOURCE: fp.gpus}, False)


def perftest_command(fp: FabricPlan, port: RdmaPort, rail: int, server_ip: str | None) -> list[str]:
    cmd = ["ib_write_bw", "-d", port.device, "-i", str(port.port), "-p", str(PERFTEST_PORT + rail), "-F",
           "--report_gbits", "-q", "4", "-D", str(PERFTEST_SECONDS)]
    if fp.gid_index is not None:  # RoCE: the RoCE v2 GID (perftest's -x; its default, index 0, is link-local v1)
        cmd += ["-x", str(fp.gid_index)]
    return cmd + ([server_ip] if server_ip else [])


class Pair:
    """One rail of one pair of nodes (the port of one name on both): the server's pod and the client's."""

    def __init__(self, client: FabricPlan, server: FabricPlan, port: RdmaPort, server_port: RdmaPort,
                 rail: int) -> None:
        self.client, self.server, self.port, self.server_port, self.rail = client, server, port, server_port, rail
        self.server_pod = rdma_pod_name("srv", server.node, rail)
        self.client_pod = rdma_pod_name("cli", client.node, rail)

    @property
    def name(self) -> str:
        return fabricplan.port_name(self.port.device, self.port.port)

    def reading(self, gbps: float | None) -> LinkReading:
        return LinkReading(self.client.node, self.server.node, self.port.device, self.port.port, gbps,
                           fabricplan.link_floor(self.port.rate, self.server_port.rate))


def pairs(fps: dict[str, FabricPlan]) -> tuple[list[Pair], dict[str, list[str]]]:
    """Every rail of every ring pair, a ring per link layer (InfiniBand and RoCE nodes do not reach each other):
    the active port of one name on both nodes. A port active on one node and not on its neighbour is a rail that
    cannot be tested: named on the node where it is not active (node -> why)."""
    out: list[Pair] = []
    missing: dict[str, list[str]] = {}
    rails: dict[tuple[str, int], int] = {}  # each port name its rail number: its perftest port, its pods' names
    for layer in sorted({fp.link_layer for fp in fps.values()}):
        ring = fabricplan.ring(sorted(n for n, fp in fps.items() if fp.link_layer == layer))
        for a, b in ring:
            mine = {(p.device, p.port): p for p in fps[a].active}
            theirs = {(p.device, p.port): p for p in fps[b].active}
            for key in sorted(set(mine) | set(theirs)):
                if key in mine and key in theirs:
                    rail = rails.setdefault(key, len(rails))
                    out.append(Pair(fps[a], fps[b], mine[key], theirs[key], rail))
                else:
                    down, up = (b, a) if key in mine else (a, b)
                    missing.setdefault(down, []).append(
                        f"{fabricplan.port_name(*key)} is not active here: its rail to {up} was not tested")
    return out, missing


def _eligible(node: Any) -> bool:
    try:
        ready = state.node_state(node).ready
    except StateError:
        return False
    q = state.quarantined(node)
    return ready and (not q or q.startswith(QUARANTINED_FOR))


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
            sound = {c.node for c in ctx.nodes if c.ready and c.ok and (
                not c.quarantine or c.quarantine.startswith(QUARANTINED_FOR))}
            fps = {n: p for n, p in fps.items() if n in sound}
        return {n: p for n, p in fps.items() if p.ports}

    def plan(self, ctx: Context) -> PhasePlan:
        fps = self._targets(ctx)
        changes = [Change(f"NCCL all-reduce across the {fp.gpus} GPUs of {n} (created, then deleted)",
                          manifest=yaml.safe_dump(nccl_pod(ctx, fp), sort_keys=False))
                   for n, fp in sorted(fps.items()) if whole_gpus(ctx, n) and fp.gpus]
        for pr in pairs(fps)[0]:
            changes.append(Change(f"RDMA write {pr.client.node} -> {pr.server.node} on {pr.name} (two pods, then "
                                  "deleted)", manifest=yaml.safe_dump(test_pod(
                                      ctx, pr.client_pod, pr.client.node,
                                      perftest_command(pr.client, pr.port, pr.rail, "SERVER-IP"),
                                      {RDMA_RESOURCE: 1}, True), sort_keys=False)))
        changes += plan_changes(ctx, {n: fp for n, fp in fps.items() if whole_gpus(ctx, n) and fp.gpus})
        if not changes:
            return self.planned("unchanged", "no fabric node to test")
        return self.planned("would-change", "the fabric's test pods", changes)

    def run(self, ctx: Context) -> PhaseResult:
        started = time.monotonic()
        fps = self._targets(ctx)
        if not fps:
            return self.result("skipped", "no fabric node to test (inventory fabric:, Ready, sound)")
        nodes = state.by_name(ctx.kube.get("nodes"))
        # as the cluster has them now (verify's own verdicts may be missing): Ready, and not in quarantine for
        # anything but its fabric
        fps = {n: p for n, p in fps.items() if n in nodes and _eligible(nodes[n])}
        if not fps:
            return self.result("skipped", "no fabric node to test (Ready, not quarantined for its GPUs)")
        nccl = {n: nccl_pod(ctx, fp) for n, fp in sorted(fps.items()) if whole_gpus(ctx, n) and fp.gpus}
        prs, missing = pairs(fps)
        clients: dict[str, dict[str, Any]] = {}
        for pr in list(prs):
            ip = internal_ip(nodes.get(pr.server.node))
            if ip:
                clients[pr.client_pod] = test_pod(ctx, pr.client_pod, pr.client.node,
                                              perftest_command(pr.client, pr.port, pr.rail, ip), {RDMA_RESOURCE: 1},
                                              True)
            else:  # no address to reach its server at: neither pod is made, the link is named untested
                prs.remove(pr)
                missing.setdefault(pr.server.node, []).append(
                    f"RDMA write from {pr.client.node} on {pr.name} not tested: this node has no InternalIP address")
        servers = {pr.server_pod: test_pod(ctx, pr.server_pod, pr.server.node,
                                       perftest_command(pr.server, pr.server_port, pr.rail, None),
                                       {RDMA_RESOURCE: 1}, True) for pr in prs}
        names = [*(d["metadata"]["name"] for d in nccl.values()), *servers, *clients]
        foreign = foreign_names(ctx, [("Pod", n, TEST_NAMESPACE) for n in names])
        if foreign:
            return self.result("failed", f"pods of gpuk8s's names exist that gpuk8s did not create: "
                               f"{', '.join(sorted(foreign)[:5])}", "delete or rename them, then verify again")
        seen: dict[str, state.PodState] = {}
        logs: dict[str, str] = {}
        # this run's names, and whatever an earlier, killed run left of another ring (its workers hold GPUs)
        ctx.kube.delete("pod", sorted({*names, *leftovers(ctx)}), TEST_NAMESPACE)
        try:
            first = [*nccl.values(), *servers.values()]
            if first:
                ctx.kube.apply("---\n".join(yaml.safe_dump(d, sort_keys=False) for d in first))
            seen = self._run_clients(ctx, prs, clients, [nccl_pod_name(n) for n in nccl], started)
            done = ("Succeeded", "Failed")
            for n in [*(d["metadata"]["name"] for d in nccl.values()), *clients]:
                if n in seen and seen[n].phase in done:
                    logs[n] = ctx.kube.logs(n, TEST_NAMESPACE, tail=LOG_LINES)
            # a server that failed, or whose client could not run: its own words (perftest's, on its node)
            for pr in prs:
                srv = seen.get(pr.server_pod)
                cli = seen.get(pr.client_pod)
                if srv is not None and srv.phase in (*done, "Running") and (cli is None or cli.phase != "Succeeded"):
                    logs[pr.server_pod] = ctx.kube.logs(pr.server_pod, TEST_NAMESPACE, tail=LOG_LINES)
        finally:
            ctx.kube.delete("pod", names, TEST_NAMESPACE)
        found, slow_ports, low_nccl, alone = self._judge(ctx, fps, nccl, prs, missing, seen, logs)
        # across nodes, after the tests above are gone (they held the GPUs and the links): the nodes whose GPUs are
        # whole and were free (a NCCL pod the scheduler could not place: its GPUs are held by other pods)
        across = {n: fps[n] for n in nccl if not unschedulable(seen.get(nccl_pod_name(n)))}
        pairs_run = PairRun(ctx, across, nodes, alone, started + ctx.options.fabric_timeout)
        ring = ring_pairs(across)
        if ring:
            found += pairs_run.run()
        # the pairs that gave a bandwidth: a pair not run (the timeout, a worker that could not start) is not one
        tested = f"{sum(1 for x in pairs_run.readings if x.busbw is not None)} of {len(ring)} pair(s) measured"
        paired = {n for pr in ring for n in pr}
        for n in sorted(set(fps) - paired):
            why = ("its GPUs are held by other pods" if n in nccl and n not in across
                   else "no other node of its link layer with whole GPUs to pair with" if n in across
                   else "its GPUs are not whole (shared, MIG or DRA) or it has none")
            found.append(findings.skipped("fabric.nccl-pairs", f"not tested: {why}", subject=findings.node(n)))
        ctx.findings.extend(found)
        took = time.monotonic() - started
        bad = [f for f in found if f.status == "fail"]
        r = self.result("failed" if bad else "passed",
                        f"{len(fps)} node(s), {len(prs)} link(s), {tested} in {took:.0f} s" +
                        (f"; {len(bad)} finding(s) failed" if bad else ""))
        if bad:
            r.remedy = "each failed finding names the node, the port and its numbers (gpuk8s verify --fabric -o json)"
        if ctx.options.fabric_quarantine:
            # the most specific finding first: a node's own GPUs, then its port, then its pairs
            self._quarantine(ctx, fps, nodes, found, {"fabric.nccl": low_nccl, "fabric.rdma": slow_ports,
                                                      "fabric.nccl-pairs": pairs_run.culprits()}, r)
        return r

    def _run_clients(self, ctx: Context, prs: list[Pair], clients: dict[str, dict[str, Any]],
                     nccl_pods: list[str], started: float) -> dict[str, state.PodState]:
        """One poll loop: each client applied as soon as its server runs (a server that never runs holds back its
        own link only), until every NCCL pod and every started client has ended, or the timeout. The pods last
        seen, by name."""
        applied: set[str] = set()

        def ended() -> tuple[bool, dict[str, state.PodState]]:
            pods = {p.name: p for p in state.pod_states(ctx.kube.get("pods", namespace=TEST_NAMESPACE))}
            ready = [pr.client_pod for pr in prs if pr.client_pod in clients and pr.client_pod not in applied
                     and pods.get(pr.server_pod) is not None and pods[pr.server_pod].phase == "Running"]
            if ready:  # not ended: the clients just applied run now
                ctx.kube.apply("---\n".join(yaml.safe_dump(clients[n], sort_keys=False) for n in sorted(ready)))
                applied.update(ready)
                return False, pods
            waiting_servers = [pr for pr in prs if pr.client_pod in clients and pr.client_pod not in applied
                               and not over(pods.get(pr.server_pod), "Running")]
            return all(over(pods.get(n)) for n in [*nccl_pods, *applied]) and not waiting_servers, pods

        return until(ended, ctx.options.fabric_timeout - (time.monotonic() - started), 1)[1]

    @staticmethod
    def _quarantine(ctx: Context, fps: dict[str, FabricPlan], nodes: dict[str, Any], found: list[findings.Finding],
                    short: dict[str, set[str]], r: PhaseResult) -> None:
        """--quarantine: a node with a measured shortfall (`short`: finding id -> nodes, in order: its NCCL run below
        its floor or wrong results, a port slow in every pair, slow in every pair of NCCL across nodes) gets the
        quarantine taint health uses (value: the finding; a test that
        did not run taints nothing: a failed pull of the test image must not quarantine the fleet); a node in
        quarantine for its fabric is released when the finding that put it there ran and passed now and no other
        fabric test of it failed (as health's release proves its own)."""
        was = {n: state.quarantined(obj) for n, obj in nodes.items()}  # the Node objects read in this run
        for node in sorted(fps):
            mine = {f.id: f for f in found if f.subject is not None and f.subject.name == node}
            why = next((f for f, ns in short.items() if node in ns), "")
            now = was.get(node, "")
            if why and not now:
                ctx.kube.taint(node, [str(quarantine_taint(why))])
                r.hosts[node] = f"quarantined ({why})"
            elif not why and now.startswith(QUARANTINED_FOR):
                proof = mine.get(now)
                if proof is not None and proof.status == "pass" and all(f.status != "fail" for f in mine.values()):
                    ctx.kube.taint(node, [f"{QUARANTINE_KEY}:NoSchedule-"])
                    r.hosts[node] = f"released: {now} passed (it was quarantined for it)"
                else:
                    r.hosts[node] = (f"kept in quarantine ({now}): "
                                     + (f"{now} did not run" if proof is None else f"{now} {proof.status}"))

    @staticmethod
    def _judge(ctx: Context, fps: dict[str, FabricPlan], nccl: dict[str, dict[str, Any]], prs: list[Pair],
               missing: dict[str, list[str]], seen: dict[str, state.PodState], logs: dict[str, str]
               ) -> tuple[list[findings.Finding], set[str], set[str], dict[str, float | None]]:
        """The findings; the nodes with a port slow in every pair (fabricplan.culprits); the nodes whose NCCL run
        measured below its floor or wrong results (what --quarantine may taint: a run that did not happen is not);
        each node's all-reduce across its own GPUs as measured (the pairs' floor: its GPUs bound them too)."""
        out = []
        readings = {n: parse_all_reduce(logs.get(nccl_pod_name(n), "")) for n in nccl}
        measured = {n: fabricplan.busbw_at(r, fabricplan.node_floor(fps[n])) for n, r in readings.items()}
        low = set()
        for n in nccl:
            pod = seen.get(nccl_pod_name(n))
            if readings[n] is None and unschedulable(pod):
                out.append(findings.skipped("fabric.nccl", f"not tested: its pod was not scheduled ({pod.unschedulable}"
                                            "): the node's GPUs are held by other pods", subject=findings.node(n)))
                continue
            f, short = fabricplan.judge(fps[n], readings[n], measured, fps, state.pod_progress(pod),
                                        classify_nccl(logs.get(nccl_pod_name(n), "")))
            if short:  # measured below its floor, or wrong results: what --quarantine taints
                low.add(n)
            out.append(f.about(findings.node(n)))
        for n in sorted(set(fps) - set(nccl)):
            why = "the node's GPUs are shared, MIG or DRA (NCCL across a node needs its GPUs whole)" if fps[n].gpus \
                else "the node has no GPU"
            out.append(findings.skipped("fabric.nccl", f"not tested: {why}", subject=findings.node(n)))
        link_readings = []
        failed: dict[str, list[str]] = {n: list(v) for n, v in missing.items()}
        for pr in prs:
            res = parse_perftest(logs.get(pr.client_pod, ""))
            link_readings.append(pr.reading(res.average if res else None))
            if res is not None:
                continue
            srv, cli = seen.get(pr.server_pod), seen.get(pr.client_pod)
            srv_said = _last(logs.get(pr.server_pod, ""))
            if cli is None or (srv is not None and srv.phase == "Failed"):
                # the server's side never served (a port down there, not scheduled, not started): named on the
                # server's node, in perftest's or the scheduler's words
                why = (f"not scheduled ({srv.unschedulable})" if srv is not None and srv.unschedulable
                       else state.pod_progress(srv))
                failed.setdefault(pr.server.node, []).append(
                    f"RDMA write from {pr.client.node} on {pr.name} did not run: the server here {why}"
                    + (f": {srv_said}" if srv_said and srv is not None and srv.phase == "Failed" else ""))
            else:
                why = (f"its server on {pr.server.node} {state.pod_progress(srv)}" if cli is None
                       else state.pod_progress(cli))
                said = _last(logs.get(pr.client_pod, ""))
                failed.setdefault(pr.client.node, []).append(
                    f"RDMA write to {pr.server.node} on {pr.name} did not run ({why}" + (f": {said}" if said else "")
                    + ")")
        out += fabricplan.judge_links(link_readings, failed, sorted(fps))
        # a node's own run bounds its pairs only where it reached its size: a run that ended early read a smaller
        # size's (lower) bandwidth, which would make the pairs' floor lenient
        alone = {n: v if (r := readings.get(n)) is not None and any(
            size >= _top(fps[n]) for size, _, _ in r.rows) else None for n, v in measured.items()}
        return out, fabricplan.culprits(link_readings), low, alone


def _last(text: str) -> str:
    """The last two lines a test pod printed, for a message (bounded)."""
    return " / ".join(ln.strip() for ln in text.strip().splitlines()[-2:])[:300]
