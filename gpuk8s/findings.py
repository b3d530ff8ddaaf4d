"""One finding model for everything gpuk8s concludes: preflight checks, verify verdicts, (later) doctor causes.

A finding has a stable id, the subject it is about (a host, a node, a pod or the cluster, and its name), a
severity (`error` or `warning`, fixed per id), a status (`pass`, `warn`, `fail`, `skip`), a message saying
what was found, the evidence (the lines that show it; may be empty) and a remedy. Every id, with its
severity and meaning, is registered once, in `FINDINGS` below (documented in docs/findings.md); the
constructors take the severity from there, so a finding with an unregistered id cannot be made.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

Status = Literal["pass", "warn", "fail", "skip"]
Severity = Literal["error", "warning"]
SubjectKind = Literal["host", "node", "pod", "cluster"]
Source = Literal["preflight", "verify", "doctor"]

STATUSES: tuple[Status, ...] = ("pass", "warn", "fail", "skip")
ID_PATTERN = r"^[a-z0-9]+(\.[a-z0-9-]+)+$"  # the same pattern as docs/preflight.schema.json


@dataclass(frozen=True)
class Spec:
    """A registered finding id: its severity, what it means, and which commands report it."""

    severity: Severity
    what: str
    sources: tuple[Source, ...] = ("preflight",)


def _p(severity: Severity, what: str) -> Spec:
    return Spec(severity, what, ("preflight",))


def _v(what: str) -> Spec:
    return Spec("error", what, ("verify",))


# Every finding id. Ids are stable: users pass preflight ids to --ignore and scripts read ids from
# --output json. Add an id here (and to docs/findings.md) before using it.
FINDINGS: dict[str, Spec] = {
    # preflight: one SSH connection and one probe per host (gpuk8s/preflight/host_checks.py, runner.py)
    "facts.parse": _p("error", "gpuk8s itself failed on the host's facts (a bug: the traceback is in the log file)"),
    "ssh.reachable": _p("error", "SSH connects (else refused, timeout, auth, hostkey-unknown, hostkey-changed, dns)"),
    "ssh.sudo": _p("error", "sudo works without a prompt (nopasswd) or with the given password"),
    "os.supported": _p("error", "Ubuntu 22.04 or Alibaba Cloud Linux 3 (treated as RHEL 8)"),
    "os.arch": _p("error", "x86_64 or aarch64"),
    "gpu.driver": Spec("error", "the NVIDIA driver is present and working (nvidia-smi answers); verify names it as "
                                "the cause when a node's GPUs are not schedulable because of it",
                       ("preflight", "verify")),
    "gpu.driver-version": _p("error", "driver >= 418.87.01"),
    "gpu.count": _p("error", "GPUs listed (count, model, memory, MIG mode); equal to the inventory's gpus"),
    "gpu.cuda": _p("warning", "CUDA versions the driver can run; warns when CUDA 12 images would fail"),
    "runtime.installed": _p("error", "Docker or containerd installed"),
    "runtime.config": _p("error", "containerd's config.toml and drop-ins are valid TOML, at most 256 KiB"),
    "runtime.version": _p("error", "Docker >= 19.03.5 or containerd >= 1.4.3"),
    "runtime.active": _p("error", "the container runtime is running"),
    "runtime.cri-plugin": _p("error", "containerd's CRI plugin is not disabled"),
    "runtime.kubernetes-compat": _p("error", "containerd at least the floor of the Kubernetes minor in the version "
                                             "matrix (2.x for the minors that dropped containerd 1.x); Docker "
                                             "needs cri-dockerd"),
    "runtime.cgroup-driver": _p("warning", "systemd cgroup driver"),
    "toolkit.installed": _p("warning", "nvidia-container-toolkit installed (GPU hosts)"),
    "toolkit.default-runtime": _p("warning", "nvidia is the container runtime's default (GPU hosts)"),
    "k8s.version-eol": _p("warning", "the Kubernetes minor has not reached its end of life (the date is in the "
                                     "version matrix; gpuk8s versions)"),
    "k8s.swap": _p("warning", "swap off"),
    "k8s.modules": _p("warning", "overlay and br_netfilter loaded"),
    "k8s.sysctl": _p("warning", "ip_forward and bridge-nf-call set"),
    "k8s.ports": _p("error", "the Kubernetes ports are free (control planes: 6443, 2379-2380, 10250, 10257, "
                             "10259; workers: 10250)"),
    "k8s.cpus": _p("error", "control planes: >= 2 CPUs"),
    "k8s.memory": _p("error", "control planes: >= 1700 MB of memory"),
    "k8s.hostname": _p("warning", "the hostname is a valid node name, equal to the inventory name"),
    "k8s.tools": _p("warning", "conntrack, socat, ebtables, ethtool present"),
    "k8s.firewalld": _p("warning", "firewalld not active"),
    # preflight, across hosts (gpuk8s/preflight/cluster_checks.py, network.py)
    "cluster.os-consistent": _p("error", "the same OS release everywhere"),
    "cluster.kernel-consistent": _p("warning", "the same kernel everywhere"),
    "cluster.arch-consistent": _p("warning", "the same architecture everywhere"),
    "cluster.unique-hostnames": _p("error", "no two hosts share a hostname"),
    "cluster.unique-macs": _p("error", "no two hosts share a MAC address"),
    "cluster.unique-product-uuid": _p("error", "no two hosts share a product_uuid"),
    "cluster.unique-machine-id": _p("error", "no two hosts share a machine-id"),
    "cluster.clock-skew": _p("warning", "host clocks within max_clock_skew_s of this machine"),
    "cluster.reachable": _p("error", "every host answered"),
    "net.rtt": _p("warning", "round-trip time to each worker within max_rtt_ms"),
    "net.bandwidth": _p("warning", "bandwidth to each worker at least min_bandwidth_gbit"),
    # verify: one verdict per node (gpuk8s/kube/state.py, gpuk8s/phases/verify.py)
    "node.verified": _v("the node is in the cluster and Ready, every GPU of its plan is allocatable and, when "
                        "test pods run, its test pod succeeded (the id of a passing node verdict)"),
    "node.not-joined": _v("the host is not a node of the cluster"),
    "node.unreadable": _v("the API server's node object could not be read"),
    "node.not-ready": _v("the node's Ready condition is not True (the kubelet's message says why)"),
    "node.unreachable": _v("the host could not be reached over SSH, so its GPUs could not be checked"),
    "node.failed": _v("a failed node verdict that names no more specific id (its message says why)"),
    "gpu.plugin-missing": _v("the NVIDIA device plugin DaemonSet is not deployed"),
    "gpu.plugin-not-scheduled": _v("no device plugin pod on the node: the label nvidia.com/gpu.present=true is "
                                   "missing, or the plugin does not tolerate the node's taints"),
    "gpu.plugin-crashing": _v("the device plugin pod's container is waiting to (re)start: CrashLoopBackOff, "
                              "ImagePullBackOff, ..."),
    "gpu.plugin-not-running": _v("the device plugin pod is Pending (or another phase), not Running"),
    "gpu.runtime-not-nvidia": _v("the container runtime's default is not nvidia, so the plugin cannot load NVML"),
    "gpu.plugin-no-nvml": _v("the device plugin runs but registered no GPU: it cannot load NVML in its container"),
    "gpu.fewer-registered": _v("the device plugin registered fewer GPUs than the node's plan expects"),
    "gpu.test-pod-rejected": _v("the kubelet rejected the GPU test pod (OutOfnvidia.com/gpu: the GPUs it "
                                "advertised are not there)"),
    "gpu.test-pod-failed": _v("the GPU test pod ran and failed (nvidia-smi failed in the container)"),
    "gpu.test-pod-unschedulable": _v("the scheduler cannot place the GPU test pod on the node"),
    "gpu.test-pod-timeout": _v("the GPU test pod did not finish in time (300 s by default)"),
}


def severity(finding_id: str) -> Severity:
    """The registered severity of `finding_id`; KeyError for an id that is not registered."""
    spec = FINDINGS.get(finding_id)
    if spec is None:
        raise KeyError(f"unregistered finding id {finding_id!r}: add it to gpuk8s.findings.FINDINGS")
    return spec.severity


def ids(source: Source) -> dict[str, Severity]:
    """The ids one command reports, with their severities, in registry order."""
    return {i: s.severity for i, s in FINDINGS.items() if source in s.sources}


@dataclass(frozen=True)
class Subject:
    """What a finding is about: a host (over SSH), a node or pod (in the cluster), or the cluster."""

    kind: SubjectKind
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name}


def host(name: str) -> Subject:
    return Subject("host", name)


def node(name: str) -> Subject:
    return Subject("node", name)


def pod(name: str) -> Subject:
    return Subject("pod", name)


def cluster(name: str = "cluster") -> Subject:
    return Subject("cluster", name)


@dataclass(frozen=True)
class Finding:
    """One conclusion. The first six fields are, in order, those of preflight's former CheckResult.

    `subject` is None where the container names it (a preflight host's checks sit under that host);
    `ignored` is True when --ignore turned a failure into a warning.
    """

    id: str
    status: Status
    severity: Severity
    message: str
    remedy: str = ""
    ignored: bool = False
    subject: Subject | None = None
    evidence: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Nothing failed: pass, warn or skip."""
        return self.status != "fail"

    def about(self, subject: Subject) -> Finding:
        """The same finding, about `subject`."""
        return replace(self, subject=subject)

    def to_json(self) -> dict[str, Any]:
        """The preflight check object (id, status, severity, message, remedy, ignored), plus evidence and,
        when known, the subject."""
        out: dict[str, Any] = {"id": self.id, "status": self.status, "severity": self.severity,
                               "message": self.message, "remedy": self.remedy, "ignored": self.ignored,
                               "evidence": list(self.evidence)}
        if self.subject is not None:
            out["subject"] = self.subject.to_json()
        return out


def _make(finding_id: str, status: Status, message: str, remedy: str, subject: Subject | None,
          evidence: Iterable[str]) -> Finding:
    return Finding(finding_id, status, severity(finding_id), message, remedy, False, subject,
                   tuple(str(e) for e in evidence))


def passed(finding_id: str, message: str, *, subject: Subject | None = None,
           evidence: Iterable[str] = ()) -> Finding:
    return _make(finding_id, "pass", message, "", subject, evidence)


def skipped(finding_id: str, message: str, remedy: str = "", *, subject: Subject | None = None,
            evidence: Iterable[str] = ()) -> Finding:
    return _make(finding_id, "skip", message, remedy, subject, evidence)


def failed(finding_id: str, message: str, remedy: str, *, subject: Subject | None = None,
           evidence: Iterable[str] = ()) -> Finding:
    """A problem: status 'fail' for an error-severity id, 'warn' for a warning-severity id."""
    status: Status = "fail" if severity(finding_id) == "error" else "warn"
    return _make(finding_id, status, message, remedy, subject, evidence)


def apply_ignores(findings: list[Finding], ignore: set[str]) -> list[Finding]:
    """--ignore ID (or 'all') turns a failure of that id into a warning, like kubeadm's flag."""
    out = []
    for f in findings:
        if f.status == "fail" and (f.id in ignore or "all" in ignore):
            f = replace(f, status="warn", ignored=True, message=f.message + " (ignored)")
        out.append(f)
    return out


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    """How many findings have each status: {'pass': n, 'warn': n, 'fail': n, 'skip': n}."""
    out: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for f in findings:
        out[f.status] += 1
    return out
