"""verify --fabric's NCCL across nodes (issue 43, docs/fabric.md): an all-reduce over all the GPUs of two nodes, for
each pair of a ring, as the MPI Operator runs nccl-tests.

nccl-tests runs more than one process only under MPI (its README), so on each tested node a worker pod holds all
the node's GPUs and the RDMA devices and runs sshd on the host network (port SSH_PORT, the node's address only),
and for each pair a launcher pod runs `mpirun` across the two workers' addresses. The SSH material is made for the
run and nowhere else: a client key (the launcher's identity, the workers' only authorized key) and a host key (the
workers' sshd; the launcher verifies it by HostKeyAlias: no host key is accepted unseen), in one Secret deleted with
the pods. A test holds all of a node's GPUs, so the ring's pairs run in rounds where no node is in two pairs.

Each pair's bus bandwidth is judged against its floor (fabricplan.pair_floor: what the NICs allow, or the nodes'
own GPUs); a node slow in both of its pairs is named, a slow pair whose ends are fine elsewhere named as the path
between them (fabricplan.judge_pairs).
"""

from __future__ import annotations

import base64
import ipaddress
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpuk8s import fabricplan, findings, logs, remote
from gpuk8s.doctor.classify import parse_fit_error
from gpuk8s.fabricplan import FabricPlan, PairReading
from gpuk8s.facts.fabric import classify_nccl, parse_all_reduce, parse_nccl_channels
from gpuk8s.gpuplan import GPU_RESOURCE, RDMA_RESOURCE
from gpuk8s.kube import state
from gpuk8s.phases.base import Change, Context
from gpuk8s.phases.fabric_pods import PROOF_LABELS, over, test_pod
from gpuk8s.phases.poll import until
from gpuk8s.phases.verify import TEST_NAMESPACE, _pod_name, foreign_names

SSH_PORT = 18514  # the workers' sshd, on the host network: beside perftest's 18515 + rail, not the host's own 22
SSH_DIR = "/etc/gpuk8s-ssh"  # the Secret's files in the worker and launcher pods
SECRET = "gpuk8s-fabric-ssh"
HOST_ALIAS = "gpuk8s-fabric-worker"  # the name the launcher's known_hosts gives the workers' one host key
# Open MPI's mpirun, wherever the test image's PATH has it, called by its absolute path, which Open MPI takes as
# --prefix: the workers' orted and libraries are found under the same directory, with no PATH from a login shell
# (Open MPI's mpirun(1), "Remote Execution"). The arguments go through "$@": no value is parsed by the shell.
MPIRUN = ["sh", "-c", 'exec "$(command -v mpirun)" "$@"', "mpirun"]
# of a launcher's log: NCCL's INFO lines (500-600 per node of 8 GPUs, nccl-tests logs), the rank list and the table
LOG_LINES = 6000

# sshd as the workers run it: keys only, root only by key, nothing forwarded. StrictModes off: the files are a
# Secret volume (root's, read-only, 0400) whose directory the kubelet makes, not a home directory sshd can judge.
SSHD_CONFIG = f"""\
Port {SSH_PORT}
HostKey {SSH_DIR}/host_key
AuthorizedKeysFile {SSH_DIR}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
AuthenticationMethods publickey
PasswordAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
PidFile /run/gpuk8s-fabric-sshd.pid
"""
# how mpirun's ssh reaches a worker (Open MPI's plm_rsh_args): the run's key, the run's known host, nothing asked
# (the MPI Operator's launcher retries: ConnectionAttempts=10 in its OMPI_MCA_plm_rsh_args)
RSH_ARGS = (f"-p {SSH_PORT} -i {SSH_DIR}/id -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes "
            f"-o UserKnownHostsFile={SSH_DIR}/known_hosts -o HostKeyAlias={HOST_ALIAS} -o ConnectTimeout=20 "
            "-o ConnectionAttempts=10")


def worker_name(node: str) -> str:
    return _pod_name("gpuk8s-fabric-worker", node)


def launcher_name(a: str) -> str:
    """The launcher of the pair a node starts (in a ring each node starts one pair)."""
    return _pod_name("gpuk8s-fabric-mpi", a)


@dataclass
class Keys:
    """The run's SSH material: the Secret's data (base64), registered as secrets (never shown or logged)."""

    data: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def new() -> Keys:
        client, client_pub = remote.new_key()
        host, host_pub = remote.new_key()
        files = {"id": client, "authorized_keys": client_pub + "\n", "host_key": host,
                 "known_hosts": f"{HOST_ALIAS} {host_pub}\n", "sshd_config": SSHD_CONFIG}
        logs.register_secret(client)
        logs.register_secret(host)
        data = {k: base64.b64encode(v.encode()).decode() for k, v in files.items()}
        for k in ("id", "host_key"):
            logs.register_secret(data[k])
        return Keys(data)


def secret(keys: Keys | None) -> dict[str, Any]:
    """The Secret of the run's SSH material; without keys (a dry run), its shape with the keys left out."""
    data = keys.data if keys is not None else {k: "(made at run time, never shown)" for k in (
        "id", "authorized_keys", "host_key", "known_hosts", "sshd_config")}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET, "namespace": TEST_NAMESPACE, "labels": dict(PROOF_LABELS)},
            "data": data}


# what of the Secret each pod mounts: a worker has no use for the client's private key, a launcher none for the
# workers' host key (a pod that held both could pose as either end)
WORKER_FILES = ("authorized_keys", "host_key", "sshd_config")
LAUNCHER_FILES = ("id", "known_hosts")


def _pod(ctx: Context, name: str, node: str, command: list[str], limits: dict[str, int],
         host_network: bool, files: tuple[str, ...]) -> dict[str, Any]:
    """A fabric test pod with `files` of the run's SSH material mounted (read-only, 0400), and nothing else of it."""
    pod = test_pod(ctx, name, node, command, limits, host_network)
    pod["spec"]["volumes"] = [{"name": "ssh", "secret": {"secretName": SECRET, "defaultMode": 0o400,
                                                         "items": [{"key": f, "path": f} for f in files]}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "ssh", "mountPath": SSH_DIR, "readOnly": True}]
    return pod


def worker_pod(ctx: Context, fp: FabricPlan, ip: str) -> dict[str, Any]:
    """All the node's GPUs and its RDMA devices, sshd on the node's address (hostNetwork: NCCL's bootstrap and the
    fabric's addresses are the host's)."""
    cmd = ["sh", "-c", f"mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e -f {SSH_DIR}/sshd_config "
                       f"-o ListenAddress={ip}"]
    pod = _pod(ctx, worker_name(fp.node), fp.node, cmd, {GPU_RESOURCE: fp.gpus, RDMA_RESOURCE: 1}, True,
               WORKER_FILES)
    # the ranks of one node share memory segments through /dev/shm: the runtime's 64 MiB is too small for NCCL
    # (coreweave/nccl-tests' own MPIJob mounts a memory emptyDir there)
    pod["spec"]["volumes"].append({"name": "shm", "emptyDir": {"medium": "Memory"}})
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "shm", "mountPath": "/dev/shm"})
    return pod


def nccl_env(a: FabricPlan, b: FabricPlan) -> dict[str, str]:
    """NCCL's environment for both ends (mpirun's -x sets it for every rank): the HCAs of both (NCCL uses those
    of the list a node has); the GID index where both have the same."""
    hcas = dict.fromkeys([*a.nccl_env()["NCCL_IB_HCA"].lstrip("=").split(","),
                          *b.nccl_env()["NCCL_IB_HCA"].lstrip("=").split(",")])
    # the ring algorithm: on two nodes NCCL's trees (NVLS) go beyond the NICs and hide a slow one; the maintainers'
    # advice to measure the network is NCCL_ALGO=RING (nccl-tests issue 196), whose bound is the NICs' figure
    # NCCL_DEBUG=INFO: NCCL's connection lines say whether GPUDirect RDMA carried the data (fabricplan.gpudirect_used)
    env = {"NCCL_IB_HCA": "=" + ",".join(hcas), "NCCL_ALGO": "Ring", "NCCL_DEBUG": "INFO"}
    if a.gid_index is not None and a.gid_index == b.gid_index:
        env["NCCL_IB_GID_INDEX"] = str(a.gid_index)
    return env


def launcher_command(a: FabricPlan, b: FabricPlan, ips: tuple[str, str], size: int) -> list[str]:
    cmd = [*MPIRUN, "--allow-run-as-root", "-np", str(a.gpus + b.gpus), "-H", f"{ips[0]}:{a.gpus},{ips[1]}:{b.gpus}",
           "--bind-to", "none", "--mca", "plm_rsh_args", RSH_ARGS]
    for k, v in sorted(nccl_env(a, b).items()):
        cmd += ["-x", f"{k}={v}"]
    from_ = min(128 << 20, size)
    return cmd + ["/opt/nccl-tests/build/all_reduce_perf", "-b", str(from_), "-e", str(size), "-f", "2", "-g", "1"]


def launcher_pod(ctx: Context, a: FabricPlan, b: FabricPlan, ips: tuple[str, str], size: int) -> dict[str, Any]:
    """On the pod network (mpirun's daemons on the workers call it back there), no GPU: it only starts the ranks."""
    return _pod(ctx, launcher_name(a.node), a.node, launcher_command(a, b, ips, size), {}, False, LAUNCHER_FILES)


def pair_size(a: FabricPlan, b: FabricPlan) -> int:
    """The size the pair's bandwidth is read at: the published floor's where both nodes have one, else 1 GiB."""
    fa, fb = fabricplan.node_floor(a), fabricplan.node_floor(b)
    return fa.size if fa is not None and fb is not None and fa.size == fb.size else 1 << 30


def address(node: Any) -> str | None:
    """The node's InternalIP as an address (the API's text is data: it reaches a command line)."""
    for a in (node.get("status", {}).get("addresses") or []) if isinstance(node, dict) else []:
        if isinstance(a, dict) and a.get("type") == "InternalIP" and isinstance(a.get("address"), str):
            try:
                return str(ipaddress.ip_address(a["address"]))
            except ValueError:
                return None
    return None


def ring_pairs(fps: dict[str, FabricPlan]) -> list[tuple[str, str]]:
    """A ring per link layer of the nodes given (whole GPUs: the caller's choice)."""
    out: list[tuple[str, str]] = []
    for layer in sorted({fp.link_layer for fp in fps.values()}):
        out += fabricplan.ring(sorted(n for n, fp in fps.items() if fp.link_layer == layer))
    return out


def plan_changes(ctx: Context, fps: dict[str, FabricPlan]) -> list[Change]:
    prs = ring_pairs(fps)
    if not prs:
        return []
    out = [Change(f"the SSH keys of NCCL's test across nodes (a Secret {SECRET}, made for the run, then deleted)",
                  manifest=yaml.safe_dump(secret(None), sort_keys=False))]
    nodes = sorted({n for pr in prs for n in pr})
    for n in nodes:
        out.append(Change(f"an sshd worker holding the {fps[n].gpus} GPUs of {n} (then deleted)",
                          manifest=yaml.safe_dump(worker_pod(ctx, fps[n], "NODE-IP"), sort_keys=False)))
    for i, rnd in enumerate(fabricplan.rounds(prs), 1):
        for a, b in rnd:
            out.append(Change(f"round {i}: NCCL all-reduce across {a} and {b} (a launcher pod, then deleted)",
                              manifest=yaml.safe_dump(launcher_pod(ctx, fps[a], fps[b], ("A-IP", "B-IP"),
                                                                   pair_size(fps[a], fps[b])), sort_keys=False)))
    return out


# what a launcher that could not start its ranks says that matters: ssh's own line (OpenSSH: "ssh: connect to host
# H port P: Connection refused", "Host key verification failed.", "Permission denied (publickey)") and the headline
# of Open MPI's help message ("ORTE was unable to reliably start one or more daemons.", its help-errmgr-base.txt;
# PRRTE's "PRTE has lost communication ..." from Open MPI 5); the rest of that message is a generic list of causes
_MPI_SAID = re.compile(r"^(ssh: .{1,200}|.{0,80}Host key verification failed\.?|"
                       r".{0,80}Permission denied \(.{1,60}\)\.?|ORTE was unable to .{1,100}|PRTE has lost .{1,100}|"
                       r"An ORTE daemon has unexpectedly failed.{0,60})$")


def launcher_said(text: str) -> str:
    """What the launcher's log says of its failure (bounded): mpirun's and ssh's words where it has them, else its
    last lines."""
    lines = [ln.strip()[:1000] for ln in text.strip().splitlines()[-200:]]
    said = list(dict.fromkeys(ln for ln in lines if _MPI_SAID.match(ln)))
    return " / ".join(said[:3] if said else lines[-3:])[:400]


# OpenSSH's own words for a worker it could not reach (sshconnect.c: "ssh: connect to host %s port %s: %s")
_SSH_TO = re.compile(r"ssh: connect to host ([0-9A-Fa-f:.]{1,45}) port \d{1,5}: ")


def gpus_held(reasons: dict[str, int]) -> bool:
    """Whether kube-scheduler's reasons (classify.parse_fit_error) say the node lacks free GPUs and nothing else it
    could offer (another resource short): the pinned node's GPUs are held by other pods. Reasons about the other
    nodes (affinity, a prefilter) do not count."""
    short = {r for r in reasons if r.startswith("Insufficient ")}
    return short == {f"Insufficient {GPU_RESOURCE}"}


class PairRun:
    """The test across nodes of one verify --fabric run: its pods made, polled and deleted; its findings."""

    def __init__(self, ctx: Context, fps: dict[str, FabricPlan], nodes: dict[str, Any],
                 alone: dict[str, float | None], deadline: float, sleep: Callable[[float], None] = time.sleep):
        self.ctx, self.fps, self.nodes, self.alone, self.deadline, self.sleep = ctx, fps, nodes, alone, deadline, sleep
        self.failed: dict[str, list[str]] = {}
        self.skipped: dict[str, list[str]] = {}  # node -> its pairs not run for want of its GPUs (held by other pods)
        self.readings: list[PairReading] = []
        self.sizes: dict[tuple[str, str], int] = {}
        self.ips: dict[str, str] = {}  # a worker's address -> its node

    def names(self) -> list[str]:
        prs = ring_pairs(self.fps)
        return [*(worker_name(n) for n in sorted({n for pr in prs for n in pr})), *(launcher_name(a) for a, _ in prs)]

    def _pods(self) -> dict[str, state.PodState]:
        return {p.name: p for p in state.pod_states(self.ctx.kube.get("pods", namespace=TEST_NAMESPACE))}

    def _wait(self, names: list[str], done: Callable[[state.PodState | None], bool]) -> dict[str, state.PodState]:
        def seen() -> tuple[bool, dict[str, state.PodState]]:
            pods = self._pods()
            return all(done(pods.get(n)) for n in names), pods

        return until(seen, self.deadline - time.monotonic(), 1, self.sleep)[1]

    def run(self) -> list[findings.Finding]:
        """The workers, then the rounds; the pods and the Secret deleted whatever happens."""
        kube = self.ctx.kube
        prs = ring_pairs(self.fps)
        ips = {n: address(self.nodes.get(n)) for pr in prs for n in pr}
        self.ips = {ip: n for n, ip in ips.items() if ip is not None}
        for a, b in list(prs):
            gone = [n for n in (a, b) if ips[n] is None]
            if gone:
                prs.remove((a, b))
                for n in (a, b):
                    self.failed.setdefault(n, []).append(
                        f"all-reduce {a} + {b} not tested: {', '.join(gone)} has no InternalIP address")
        if not prs:
            return self._judge()
        workers = sorted({n for pr in prs for n in pr})
        names = self.names()
        foreign = foreign_names(self.ctx, [*(("Pod", n, TEST_NAMESPACE) for n in names),
                                           ("Secret", SECRET, TEST_NAMESPACE)])
        if foreign:  # neither deleted nor overwritten: the test does not run
            for n in workers:
                self.failed.setdefault(n, []).append(
                    f"NCCL across nodes not tested: {', '.join(sorted(foreign)[:5])} in namespace {TEST_NAMESPACE} "
                    "exist(s) and gpuk8s did not create it: delete or rename it")
            return self._judge()
        # a run killed midway left its pods (a pod's spec cannot be changed): gone before this run's are made
        kube.delete("pod", names, TEST_NAMESPACE)
        try:
            kube.apply(yaml.safe_dump(secret(Keys.new()), sort_keys=False))
            kube.apply("---\n".join(yaml.safe_dump(worker_pod(self.ctx, self.fps[n], str(ips[n])), sort_keys=False)
                                    for n in workers))
            pods = self._wait([worker_name(n) for n in workers],
                              lambda p: p is not None and (p.phase == "Running" or over(p)))
            for rnd in fabricplan.rounds(prs):
                ready = [(a, b) for a, b in rnd if all(
                    pods.get(worker_name(n)) is not None and pods[worker_name(n)].phase == "Running" for n in (a, b))]
                for a, b in rnd:
                    if (a, b) not in ready:
                        self._worker_missing(a, b, pods)
                if ready and time.monotonic() > self.deadline:
                    for a, b in ready:  # named, never a silent gap: a node's other pair must not pass for it alone
                        for n in (a, b):
                            self.failed.setdefault(n, []).append(
                                f"all-reduce {a} + {b} not run: verify --fabric's timeout passed "
                                f"({self.ctx.options.fabric_timeout:g} s)")
                    continue
                if not ready:
                    continue
                for a, b in ready:
                    self.sizes[(a, b)] = pair_size(self.fps[a], self.fps[b])
                kube.apply("---\n".join(yaml.safe_dump(launcher_pod(
                    self.ctx, self.fps[a], self.fps[b], (str(ips[a]), str(ips[b])), self.sizes[(a, b)]),
                    sort_keys=False) for a, b in ready))
                pods = self._wait([launcher_name(a) for a, _ in ready], over)
                for a, b in ready:
                    self._read(a, b, pods.get(launcher_name(a)))
                kube.delete("pod", [launcher_name(a) for a, _ in ready], TEST_NAMESPACE)
        finally:
            kube.delete("pod", names, TEST_NAMESPACE)
            kube.delete("secret", [SECRET], TEST_NAMESPACE)
        return self._judge()

    def _worker_missing(self, a: str, b: str, pods: dict[str, state.PodState]) -> None:
        def running(n: str) -> bool:
            w = pods.get(worker_name(n))
            return w is not None and w.phase == "Running"

        for n in (a, b):
            if running(n):
                continue
            w = pods.get(worker_name(n))
            partner = b if n == a else a
            if running(partner):  # never a silent gap: its pair is named on the partner too, as not run
                self.skipped.setdefault(partner, []).append(f"all-reduce {a} + {b} not run: the worker on {n} did "
                                                            "not run")
            said_by_scheduler = w.unschedulable if w is not None else ""
            fit = parse_fit_error(said_by_scheduler) if said_by_scheduler else None
            if fit is not None and gpus_held(fit.reasons):
                # its GPUs are held by other pods: not tested, as the node's own NCCL test is skipped then
                self.skipped.setdefault(n, []).append(
                    f"all-reduce {a} + {b} not run: its GPUs are held by other pods (the worker not scheduled: "
                    f"{said_by_scheduler})")
                continue
            why = (f"not scheduled ({w.unschedulable})" if w is not None and w.unschedulable
                   else state.pod_progress(w))
            said = launcher_said(self.ctx.kube.logs(worker_name(n), TEST_NAMESPACE, tail=20)) if (
                w is not None and w.phase == "Failed") else ""
            self.failed.setdefault(n, []).append(
                f"all-reduce {a} + {b} did not run: the worker here {why}" + (f": {said}" if said else ""))

    def _read(self, a: str, b: str, pod: state.PodState | None) -> None:
        text = self.ctx.kube.logs(launcher_name(a), TEST_NAMESPACE, tail=LOG_LINES) if (
            pod is not None and pod.phase in ("Succeeded", "Failed")) else ""
        r = parse_all_reduce(text)
        size = self.sizes[(a, b)]
        floor = fabricplan.pair_floor(self.fps[a], self.fps[b], size, self.alone)
        hosts = dict(r.hosts) if r is not None else {}
        if r is not None and r.wrong:
            for n in (a, b):
                self.failed.setdefault(n, []).append(f"all-reduce {a} + {b}: {r.wrong} wrong result(s)")
            return
        if r is not None and size in {s for s, _, _ in r.rows} and len(hosts) == 2 and sum(hosts.values()) == (
                self.fps[a].gpus + self.fps[b].gpus):
            got = fabricplan.busbw_at(r, floor)
            modes = (self._gpudirect(a), self._gpudirect(b))
            note, bad = fabricplan.gpudirect_used(modes, parse_nccl_channels(text))
            self.readings.append(PairReading(a, b, got, floor.busbw if floor is not None else None, note))
            if bad:
                for n in (a, b):
                    self.failed.setdefault(n, []).append(f"all-reduce {a} + {b}: {bad}")
            return
        if r is not None:  # a table, but not across both nodes' GPUs or not to its size
            why = (f"its ranks ran on {len(hosts)} host(s), not on both nodes" if len(hosts) != 2
                   else f"it ended before {size >> 20} MiB (the pod {state.pod_progress(pod)})")
        else:
            failures = classify_nccl(text)
            said = launcher_said(text)
            why = ("; ".join(f.detail for f in failures[:2]) or
                   (f"the launcher {state.pod_progress(pod)}" + (f": {said}" if said else "")))
        # ssh names the address it could not reach: that worker's node, not both ends of the pair
        m = _SSH_TO.search(why)
        unreached = self.ips.get(m.group(1)) if m else None
        for n in ((unreached,) if unreached in (a, b) else (a, b)):
            self.failed.setdefault(n, []).append(f"all-reduce {a} + {b} printed no result: {why}")
        if unreached in (a, b):  # never a silent gap: named on the other end too, as not run
            other = b if unreached == a else a
            self.skipped.setdefault(other, []).append(f"all-reduce {a} + {b} not run: ssh could not reach the worker "
                                                      f"on {unreached}")

    def _gpudirect(self, node: str) -> str:
        f = self.ctx.facts.get(node)
        return fabricplan.gpudirect(self.ctx.inv.host(node), f)[0] if f is not None else "none"

    def _judge(self) -> list[findings.Finding]:
        nodes = sorted(self.fps)
        return fabricplan.judge_pairs(self.readings, self.failed, nodes, self.sizes, self.skipped)

    def culprits(self) -> set[str]:
        """The nodes slow in every pair they were in: what --quarantine taints."""
        return fabricplan.culprits(self.readings)
