"""One finding model for everything gpuk8s concludes: preflight checks, verify verdicts, (later) doctor causes.

A finding has a stable id, the subject it is about (a host, a node, a pod or the cluster, and its name), a
severity (`error` or `warning`, fixed per id), a status (`pass`, `warn`, `fail`, `skip`), a message saying
what was found, the evidence (the lines that show it; may be empty) and a remedy. Every id, with its
severity and meaning, is registered once, in `FINDINGS` below (documented in docs/findings.md); the
constructors take the severity from there, so a finding with an unregistered id cannot be made.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

Status = Literal["pass", "warn", "fail", "skip"]
Severity = Literal["error", "warning"]
SubjectKind = Literal["host", "node", "pod", "cluster"]
Source = Literal["preflight", "verify", "doctor", "reset", "upgrade", "monitoring", "health"]

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
                                             "needs cri-dockerd, which install sets up"),
    "runtime.cgroup-driver": _p("warning", "systemd cgroup driver"),
    "toolkit.installed": _p("warning", "nvidia-container-toolkit installed (GPU hosts)"),
    "toolkit.default-runtime": _p("warning", "nvidia is the container runtime's default (GPU hosts)"),
    "toolkit.dropin-path": _p("warning", "no nvidia drop-in in /etc/containerd/config.d/ (nvidia-ctk 1.18.0 wrote it "
                                         "there instead of conf.d/; install moves it away)"),
    "k8s.version-eol": _p("warning", "the Kubernetes minor has not reached its end of life (the date is in the "
                                     "version matrix; gpuk8s versions)"),
    "k8s.cgroup-v2": _p("error", "the host runs cgroup v2 where the Kubernetes minor's kubelet refuses cgroup v1 "
                                 "(from the version matrix's cgroup_v2_from on: failCgroupV1)"),
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
    "bundle.coverage": Spec("error", "install --bundle: the bundle serves the host (its OS release, architecture, "
                            "container runtime and, where gpuk8s manages the driver, its branch and kernel); driver "
                            "upgrade --bundle: a node whose new branch it lacks is left as it was",
                            ("preflight", "upgrade")),
    "net.sources": _p("warning", "the host reaches every source install fetches from: package repositories, "
                      "image registries (or the inventory's mirror) and the CNI manifest"),
    # verify: one verdict per node (gpuk8s/kube/state.py, gpuk8s/phases/verify.py)
    "node.verified": _v("the node is in the cluster and Ready, every GPU of its plan is allocatable and, when "
                        "test pods run, its test pod succeeded (the id of a passing node verdict)"),
    "node.not-joined": _v("the host is not a node of the cluster"),
    "node.unreadable": _v("the API server's node object could not be read"),
    "node.not-ready": _v("the node's Ready condition is not True (the kubelet's message says why)"),
    "node.unreachable": _v("the host could not be reached over SSH, so its GPUs could not be checked"),
    "node.failed": _v("a failed node verdict that names no more specific id (its message says why)"),
    "node.quarantined": Spec("warning", "the node has the taint gpuk8s.io/quarantine (its GPUs failed the health "
                             "check before it joined): it takes no new pods and verify runs no test pod on it",
                             ("verify",)),
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
    "gpu.test-name-taken": _v("a test pod or ResourceClaimTemplate verify would create in default exists and gpuk8s "
                              "did not create it: left alone, the node not tested"),
    # Dynamic Resource Allocation (docs/dra.md): a dra node's devices as the DRA driver publishes them
    "dra.no-devices": _v("no ResourceSlice of gpu.nvidia.com lists the dra node's devices: NVIDIA's DRA kubelet "
                         "plugin is not running or not registered there"),
    "node.allocator-differs": _v("the node is on another allocator than its inventory's allocator: (install did "
                                 "not switch it while pods held its GPUs): gpuk8s allocator moves it"),
    "dra.double-served": _v("both allocators serve the node's GPUs: a dra node still advertises nvidia.com/ "
                            "resources, or a device-plugin node still has devices in a ResourceSlice (each would "
                            "hand out the same GPUs)"),
    "dra.devices-missing": _v("the DRA driver publishes fewer GPUs (or MIG devices) on the dra node than its plan "
                              "expects"),
    # shared GPUs (docs/sharing.md): verify's causes and proofs, preflight's warnings
    "gpu.sharing-config": _v("the device plugin cannot select the node's sharing config (its config-manager finds "
                             "no such name in the ConfigMap, or the ConfigMap is missing)"),
    "gpu.sharing-not-applied": _v("the node advertises whole GPUs (or another count) instead of GPUs x replicas "
                                  "under the planned resource name: its nvidia.com/device-plugin.config label or "
                                  "the config it selects is not the plan's"),
    "gpu.mps-daemon-missing": _v("an MPS node has no running MPS control daemon pod: the device plugin cannot "
                                 "hand out MPS replicas (error waiting for MPS daemon)"),
    "gpu.hami-missing": _v("a HAMi node has no running HAMi device plugin pod, or HAMi's scheduler is not deployed"),
    "gpu.mig-resources": _v("a MIG node advertises the MIG resources of its layout (single: nvidia.com/gpu = its MIG "
                            "devices; mixed: each nvidia.com/mig-<profile> its planned count); else the host's MIG "
                            "devices differ from its layout (lost at a reboot without gpuk8s-mig.service, or a "
                            "pending mode) or the plugin's migStrategy is not the plan's"),
    "gpu.sharing-proof": _v("on one shared node, GPUs x replicas one-slice pods all bound, one more Pending "
                            "(Insufficient ...), and (failRequestsGreaterThanOne) a pod asking for 2 rejected "
                            "with UnexpectedAdmissionError; HAMi: a pod asking for GPU memory bound"),
    "gpu.sharing-memory": _p("warning", "time-slicing has no memory isolation: replicas x the stated per-pod "
                                        "memory (gpu_sharing.pod_memory_mib) fits in one GPU's memory"),
    "gpu.mps-clients": _p("warning", "MPS on a GPU of compute capability below 7.5 serves at most 16 clients per "
                                     "GPU (48 from 7.5 on): replicas within that"),
    "gpu.sharing-max-pods": _p("warning", "GPUs x replicas slices (and the node's own pods) fit in the kubelet's "
                                          "110 pods per node (its default maxPods)"),
    "gpu.sharing-plugin-version": _p("warning", "the device plugin version supports the node's sharing strategy "
                                                "(time-slicing from v0.12.0, MPS from v0.15.0)"),
    # the RDMA fabric (gpuk8s/preflight/fabric_checks.py, docs/fabric.md): GPU nodes whose inventory sets fabric:
    "fabric.ports": _p("error", "the node has active RDMA ports of its fabric's link layer: every device fabric.nics "
                                "names, at least fabric.expect.ports of them"),
    "fabric.link-layer": _p("error", "the node's RDMA ports are of the link layer fabric.link_layer names "
                                     "(InfiniBand, or Ethernet for RoCE)"),
    "fabric.subnet-manager": _p("error", "each InfiniBand port with a link was configured by a subnet manager (not "
                                         "stuck in Initializing)"),
    "fabric.rate": _p("error", "every active port of the fabric runs at fabric.expect.rate, and none slower than the "
                               "node's other ports"),
    "fabric.roce-gid": _p("error", "on RoCE, each active port of the fabric has a RoCE v2 GID with an IPv4 address "
                                   "(the one NCCL and its peers use)"),
    "fabric.roce-mtu": _p("warning", "on RoCE, each active port's network interface has an MTU that gives "
                                     "4096-byte RoCE packets (4192 or more: the kernel's iboe_get_mtu takes 96 bytes "
                                     "of headers)"),
    "fabric.gpudirect": _p("warning", "GPUDirect RDMA has a path: dma-buf (the open kernel modules, Linux 5.12 or "
                                      "newer) or nvidia-peermem (fabric.gpudirect: peermem)"),
    "fabric.peermem": _p("error", "with fabric.gpudirect: peermem, nvidia-peermem can load: a driver of branch 470 or "
                                  "newer, no nv_peer_mem loaded"),
    "fabric.affinity": _p("warning", "each GPU has a NIC of the fabric behind its own PCIe switch (nvidia-smi topo -m: "
                                     "PIX or PXB), not across the CPU or the sockets"),
    "fabric.nccl": _v("verify --fabric: NCCL all-reduce across the node's GPUs reaches the floor of its shape (a "
                      "share of the published result; else of the best node of its shape)"),
    "fabric.nccl-pairs": _v("verify --fabric: NCCL all-reduce across the GPUs of two nodes, for each pair of a ring, "
                            "reaches a share of what their NICs allow; a node slow in both its pairs, or the path of "
                            "a slow pair, named"),
    "fabric.rdma": _v("verify --fabric: RDMA write between the same rail of ring neighbours reaches a share of the "
                      "ports' rate; a port slow in both its pairs, or the link of a slow pair, named"),
    "fabric.acs": _p("warning", "no PCIe device redirects peer-to-peer traffic to the root complex (lspci -vvv's "
                                "ACSCtl ReqRedir/CmpltRedir off: NCCL's troubleshooting guide)"),
    "cluster.fabric-consistent": _p("error", "every node with a fabric has the same link layer and port rate "
                                             "(a job's ranks run at the slowest node's rate)"),
    # MIG (gpuk8s/preflight/mig_checks.py, docs/mig.md)
    "gpu.mig-capable": _p("error", "every GPU that the node's `mig:` layout partitions has MIG (A100, A30, H100, "
                                   "H200, B200...; not L4, T4, V100), and its MIG state can be read"),
    "gpu.mig-profile": _p("error", "the layout's profiles exist on each GPU's model and fit on one GPU (else: the "
                                   "profile, the model's smallest profile)"),
    "gpu.mig-driver": _p("error", "the driver is at or above MIG's floor for the GPU (A100 R450 450.80.02, "
                                  "A30 R460, H100 R525, H20 R535, H200 R550, B200 R570, B300 R580)"),
    "gpu.mig-pending": _p("warning", "no GPU has a MIG mode change pending (current differs from pending until a GPU "
                                     "reset or a reboot)"),
    "gpu.mig-processes": _p("warning", "no process holds a GPU whose MIG layout must change (a reset or instance "
                                       "change is refused while one does)"),
    # Dynamic Resource Allocation (gpuk8s/preflight/dra_checks.py, docs/dra.md): a host with allocator: dra
    "dra.driver": _p("error", "the NVIDIA driver is at or above the DRA driver's floor (branch 565)"),
    "dra.cdi": _p("error", "the container runtime hands CDI devices to containers: containerd 2.x (unless its "
                           "config sets enable_cdi = false), or 1.x with enable_cdi = true"),
    # the NVIDIA driver (gpuk8s/preflight/driver_checks.py, docs/driver.md)
    "driver.plan": _p("error", "with driver: {manage: true}, the branch and kernel modules install gives the node, "
                               "or why its settings cannot work on its GPUs (open modules before Turing, proprietary "
                               "on Blackwell or Grace Hopper, a branch that does not serve them)"),
    "driver.mismatch": _p("error", "the loaded kernel module and the driver's NVML libraries are one version (else "
                                   "'Driver/library version mismatch' until a reboot)"),
    "driver.nouveau": _p("warning", "nouveau is not loaded (it keeps the nvidia module off the GPUs)"),
    "driver.secure-boot": _p("warning", "with Secure Boot on, the nvidia module on disk is signed"),
    "driver.kernel-headers": _p("warning", "the running kernel's headers, where a managed driver is built by DKMS"),
    "driver.fabric-manager": _p("error", "on NVSwitch systems, nvidia-fabricmanager of the driver's version runs "
                                         "(else CUDA error 802, 'system not yet initialized')"),
    "driver.persistence": _p("warning", "nvidia-persistenced is active"),
    "driver.held": _p("warning", "the driver's packages are held against automatic upgrades"),
    # gpuk8s verify with monitoring enabled (gpuk8s/phases/monitoring_verify.py, docs/monitoring.md)
    "monitoring.verified": _v(
        "the node's DCGM exporter pod is Running and its /metrics (read through the API "
        "server's pod proxy) has series of every GPU (or MIG device) of the node's plan"),
    "monitoring.exporter-missing": _v(
        'no DCGM exporter pod on a GPU node (the DaemonSet is missing, or the node lacks '
        'the label nvidia.com/gpu.present=true or has a taint the exporter does not '
        'tolerate)'),
    "monitoring.exporter-misplaced": _v(
        'a DCGM exporter pod runs on a node that is not a GPU node'),
    "monitoring.exporter-nvml": _v(
        'the DCGM exporter cannot load NVML (its log says so, e.g. "Cannot init NVML '
        'library; err: ERROR_LIBRARY_NOT_FOUND"): the node\'s container runtime default is '
        'not nvidia'),
    "monitoring.exporter-not-running": _v(
        'the DCGM exporter pod is not Running (Pending, crashing for another reason, '
        'image not pulled)'),
    "monitoring.metrics-unreadable": _v(
        "the exporter's /metrics could not be read through the pod proxy, or is not the "
        'Prometheus text format'),
    "monitoring.series-count": _v(
        "the exporter's device series (GPU_UTIL, GPU_TEMP, ...: on a MIG GPU one per GPU instance) "
        "do not cover every GPU (or MIG device) of the node's plan"),
    "monitoring.no-pod-labels": _v(
        "the exporter cannot name the pods using GPUs: the kubelet's "
        '/var/lib/kubelet/pod-resources is not mounted in it (or a GPU pod runs and no '
        'series has a pod label)'),
    "monitoring.prometheus-missing": _v(
        'no Prometheus to ask: the deployed one is not Running, or (servicemonitor) no '
        'prometheus-operated Service exists in monitoring.prometheus_namespace'),
    "monitoring.target-missing": _v(
        "Prometheus has no scrape target for the node's exporter (its ServiceMonitor is "
        'not selected, or the scrape job finds no endpoint)'),
    "monitoring.target-down": _v(
        "Prometheus has the node's exporter as a target but its last scrape failed "
        '(lastError says why)'),
    "monitoring.name-taken": Spec("error", "refused, nothing applied: an object the monitoring would create (e.g. "
                                  "the Grafana Helm chart's Deployment grafana) exists in monitoring.namespace and "
                                  "gpuk8s did not create it", ("monitoring",)),
    # gpuk8s reset (gpuk8s/phases/reset.py, docs/reset.md): refusals before anything is done, then one per node
    "reset.last-control-plane": Spec("error", "refused: the hosts named include the cluster's last control plane "
                                     "(gpuk8s reset --all tears the cluster down)", ("reset",)),
    "reset.first-control-plane": Spec("error", "refused: the first control plane of the inventory (the one gpuk8s "
                                      "talks to) is reset only with --all", ("reset",)),
    "reset.etcd-quorum": Spec("error", "refused: removing these control planes leaves fewer etcd members than the "
                              "quorum of the members there are now", ("reset",)),
    "reset.node-reset": Spec("error", "the node was drained, reset (kubeadm reset -f and its leftovers) and its Node "
                             "deleted (and purged with --purge)", ("reset",)),
    "reset.drain-blocked": Spec("error", "the drain did not finish: a PodDisruptionBudget allows no eviction; the "
                                "node stays cordoned, nothing else done to it", ("reset",)),
    "reset.drain-failed": Spec("error", "the drain failed for another reason (kubectl's message says which pods); "
                               "the node stays cordoned, nothing else done to it", ("reset",)),
    "reset.host-unreachable": Spec("error", "the host does not answer over SSH: a worker's Node was drained and "
                                   "deleted, the host itself not reset; a control plane is left alone (its Node "
                                   "and etcd member stay)", ("reset",)),
    "reset.etcd-member-kept": Spec("error", "kubeadm reset could not remove the control plane's etcd member: its "
                                   "Node, its etcd data and the rest of the host were kept", ("reset",)),
    "reset.host-failed": Spec("error", "the reset (or purge) script failed on the host", ("reset",)),
    "reset.node-failed": Spec("error", "the node's reset failed for another reason (the message says why)",
                              ("reset",)),
    "reset.skipped": Spec("error", "not reset because a node before it in the order failed", ("reset",)),
    # gpuk8s upgrade (gpuk8s/phases/upgrade.py, docs/upgrade.md): a refusal before anything is done, then per node
    "upgrade.refused": Spec("error", "refused before anything is done: a downgrade, a minor not in the version "
                            "matrix (kubeadm upgrades one minor at a time, so every minor on the way is needed), or "
                            "no minor", ("upgrade",)),
    "upgrade.node-upgraded": Spec("error", "the node runs the new minor: kubeadm upgrade apply or node, drained, "
                                  "kubelet and kubectl upgraded and held, uncordoned", ("upgrade",)),
    "upgrade.gpu-pods-timeout": Spec("error", "GPU pods on the node were still running after --gpu-pod-timeout: "
                                     "the node was left as it was (uncordoned) and the upgrade stopped", ("upgrade",)),
    "upgrade.drain-failed": Spec("error", "the node's drain failed (kubectl's message says which pods); it stays "
                                 "cordoned", ("upgrade",)),
    "allocator.moved": Spec("error", "gpuk8s allocator: the node moved to the allocator its inventory says: drained "
                            "(GPU pods waited for), relabelled, its GPUs offered by the new allocator, a test pod "
                            "passed, uncordoned", ("upgrade",)),
    "allocator.failed": Spec("error", "gpuk8s allocator: the new allocator did not offer the node's GPUs, or its test "
                             "pod failed: the node got its former labels back (the message says what it offers)",
                             ("upgrade",)),
    "allocator.drain-failed": Spec("error", "gpuk8s allocator: the node's drain failed (kubectl's message says which "
                                   "pods); it stays cordoned and a re-run resumes there", ("upgrade",)),
    "driver.upgraded": Spec("error", "gpuk8s driver upgrade: the node runs the driver its inventory asks for: drained "
                            "(GPU pods waited for), packages installed and held, rebooted, GPUs advertised again, "
                            "uncordoned", ("upgrade",)),
    "driver.upgrade-failed": Spec("error", "gpuk8s driver upgrade: the node's drain, packages, reboot or GPUs failed "
                                  "(the message says which); it stays cordoned and a re-run resumes there",
                                  ("upgrade",)),
    "upgrade.node-failed": Spec("error", "the node's upgrade failed for another reason (a package, kubeadm; the "
                                "message says why): re-running resumes there", ("upgrade",)),
    "upgrade.host-blocked": Spec("error", "the host is not ready for the new minor: preflight for that minor fails "
                                 "or a playbook step failed (the message says which)", ("upgrade",)),
}


def _h(what: str, sev: Severity = "error") -> Spec:
    return Spec(sev, what, ("health",))


# gpuk8s health (gpuk8s/health/checks.py, docs/health.md): a GPU host's GPUs, over SSH, before or after it joins
FINDINGS.update({
    "health.gpu-count": _h("nvidia-smi lists as many GPUs as the inventory's gpus: and as lspci sees on the bus (a "
                           "GPU missing fell off the bus or failed to initialise)"),
    "health.xid": _h("no Xid since boot whose NVIDIA action is a GPU reset or a reboot (48, 64, 74, 79, 95, 119, 120), "
                     "and no GPU fallen off the bus"),
    "health.xid-app": _h("other Xids since boot: an application's fault (13, 31, 94) or informational (43, 45, 63, "
                         "92, 154, 171), or one not in gpuk8s's catalogue", "warning"),
    "health.ecc-uncorrected": _h("no uncorrectable ECC error since the driver loaded (nvidia-smi -q's volatile "
                                 "counters)"),
    "health.retired-pages-pending": _h("no page retirement waiting for a reboot (GPUs before Ampere)"),
    "health.row-remap-pending": _h("no row remapping waiting for a GPU reset (Ampere and newer)"),
    "health.row-remap-failed": _h("no row remapping failure (the GPU ran out of spare rows: replace it)"),
    "health.pcie-width": _h("every GPU's PCIe link at the width it and its slot can do", "warning"),
    "health.nvlink-down": _h("no NVLink link inactive (nvidia-smi nvlink -s)"),
    "health.clocks-slowdown": _h("no hardware clock slowdown (thermal or power brake) active", "warning"),
    "health.fabric": _h("on NVSwitch systems every GPU's fabric state is Completed, status Success"),
    "health.rdma-links": _h("the fabric level: each port of the host's RDMA fabric Active at fabric.expect.rate, no "
                            "error counter above zero (ibqueryerrors' default threshold)"),
    "health.dcgm-diag": _h("the standard and long levels: DCGM's diagnostic (dcgmi diag -r 2 / -r 3) fails no test "
                           "(skipped, and said, where DCGM is not installed)"),
    "health.release": _h("gpuk8s health --release: the quarantine taint is removed only from a node whose GPUs pass "
                         "the check now"),
})
for _id in ("ssh.reachable", "ssh.sudo", "facts.parse"):  # a host health cannot reach is named as preflight names it
    FINDINGS[_id] = replace(FINDINGS[_id], sources=(*FINDINGS[_id].sources, "health"))


def _d(what: str, sev: Severity = "error") -> Spec:
    return Spec(sev, what, ("doctor",))


# gpuk8s doctor (gpuk8s/doctor/classify.py, docs/troubleshooting.md): why a GPU pod is Pending or failing. A node
# without its GPUs gets verify's node causes (gpu.driver, gpu.plugin-*, gpu.runtime-not-nvidia, gpu.sharing-*,
# ...: the same cause, the same id), reported by doctor too, with the node's evidence.
FINDINGS.update({
    "pod.nccl": _d("the pod's log shows an NCCL failure, named from NCCL's words with its remedy (an IB completion "
                   "error, no IB device or libibverbs: a TCP fallback, GPUDirect RDMA disabled, memory registration or "
                   "memlock, a queue pair that cannot connect, a collective timeout)"),
    "pod.unknown-resource": _d("the pod asks for an extended resource no node offers (nvidia.com/gpu on a cluster "
                               "whose GPUs are MIG devices, aliyun.com/gpu-mem without gpushare, a typo)"),
    "pod.selector-mismatch": _d("the pod's nodeSelector or required node affinity matches no GPU node (the "
                                "scheduler: node(s) didn't match Pod's node affinity/selector)"),
    "pod.untolerated-taint": _d("the GPU nodes carry a taint the pod does not tolerate (the scheduler: node(s) had "
                                "untolerated taint {...})"),
    "pod.insufficient-gpu": _d("no node has enough free GPUs (or slices, MIG devices) for the pod: the scheduler "
                               "says Insufficient RESOURCE; the pods holding them are named"),
    "pod.unschedulable": _d("the scheduler cannot place the pod for a reason that is not about GPUs (its message "
                            "says which)"),
    "pod.dra-no-matching-device": _d("the pod's claim selects a device attribute (productName, profile) no node "
                                     "publishes (the scheduler: cannot allocate all claims); the devices' values "
                                     "are named"),
    "pod.dra-unallocatable": _d("the scheduler cannot allocate the pod's claims (cannot allocate all claims): the "
                                "devices that match are held by other pods (named), or no node publishes any"),
    "pod.scheduler-missing": _d("the pod names a scheduler (schedulerName, e.g. hami-scheduler) that is not "
                                "running: nobody binds it and no event says why"),
    "pod.shared-request-gt1": _d("the pod asks for more than one shared GPU where the node's sharing config sets "
                                 "failRequestsGreaterThanOne: the device plugin refuses it (UnexpectedAdmissionError)"),
    "pod.cuda-too-new": _d("the image's CUDA is newer than the node's driver supports (nvidia-container-cli: "
                           "requirement error: unsatisfied condition: cuda>=X.Y)"),
    "pod.nvml-unknown-error": _d("in the container 'Failed to initialize NVML: Unknown Error': with the systemd "
                                 "cgroup driver the container lost its GPU device access (no /dev/char symlinks "
                                 "for the NVIDIA devices)"),
    "pod.no-nvidia-runtime": _d("the pod's container did not get the GPU: the nvidia runtime is neither the "
                                "node's default nor the pod's runtimeClassName, so no driver library or nvidia-smi "
                                "is in the container"),
    "pod.driver-mismatch": _d("the pod's GPU library found the node's loaded kernel module of another version ('Driver/"
                              "library version mismatch'): the driver was upgraded without a reboot"),
    "pod.fabric-manager": _d("CUDA error 802 'system not yet initialized' in the pod: on an NVSwitch system the fabric "
                             "manager has not configured the switches"),
    "pod.gpu-oom": _d("a pod on a time-sliced (or MPS) GPU ran out of GPU memory: the replicas share one GPU's "
                      "memory with no isolation (time-slicing) or beyond their limit"),
    "pod.runtime-handler-missing": _d(
        "the pod's sandbox cannot be created (FailedCreatePodSandBox, ContainerCreating): its RuntimeClass names a "
        "runtime handler (nvidia) the node's container runtime does not have (containerd: no runtime for \"nvidia\" "
        "is configured; CRI-O: failed to find runtime handler nvidia from runtime list)"),
    "pod.driver-not-loaded": _d("the NVIDIA container toolkit's hook cannot reach the driver (nvidia-container-cli: "
                                "initialization error: nvml error: driver not loaded; load library failed: "
                                "libnvidia-ml.so.1; driver/library version mismatch): the kernel module is not "
                                "loaded (kernel update, nouveau, Secure Boot) or the driver is not installed"),
    "pod.device-nodes-missing": _d("a device node the container needs (/dev/nvidia0, /dev/nvidiactl, "
                                   "/dev/nvidia-uvm, or one a CDI spec names) does not exist on the node: lstat ... "
                                   "no such file or directory"),
    "pod.toolkit-error": _d("the NVIDIA container toolkit's hook failed for another reason (nvidia-container-cli: "
                            "ldcache error, mount error, device error: unknown device, detection error; CRI-O's "
                            "hook; unresolvable CDI devices): its message and a remedy by its text"),
    "pod.admission-rejected": _d("the kubelet refused the pod at admission (UnexpectedAdmissionError): its device "
                                 "manager could not allocate the GPU (requested number of devices unavailable, a "
                                 "GPU lost)"),
    "pod.unknown": _d("a GPU pod that is not Running or Succeeded (or has a container waiting) for a reason doctor "
                      "does not recognise: the raw evidence (status reasons, the kubelet's events, the scheduler's "
                      "message, the last log lines, the node's conditions) and where to look next"),
    "gpu.unknown": _d("a GPU node short of its plan for a reason doctor does not recognise: the node's conditions, "
                      "allocatable, the device plugin pod and its last log lines, and where to look next"),
    "gpu.plugin-image-pull": _d("the device plugin pod cannot start: its node cannot pull the plugin's image (the "
                                "kubelet's 'Failed to pull image' event says why: no such host, not found, ...)"),
    "gpu.labels-stale": _d("a GPU node offers what its plan says, but a label gpuk8s keeps on it (the GPU count, "
                           "product, memory, sharing, MIG or allocator labels) has another value than the plan's: "
                           "set when the node was in another state (a GPU lost, then back), read by selectors "
                           "and by status", "warning"),
    "gpu.plugin-socket-missing": _d("the device plugin pod runs but its socket is not in the kubelet's "
                                    "/var/lib/kubelet/device-plugins/ (nvidia-gpu.sock): it is not registered with "
                                    "the kubelet (a kubelet restart it missed)"),
})
for _id in ("node.not-joined", "node.not-ready", "node.unreachable", "gpu.driver", "gpu.plugin-missing",
            "gpu.plugin-not-scheduled", "gpu.plugin-crashing", "gpu.plugin-not-running", "gpu.runtime-not-nvidia",
            "gpu.plugin-no-nvml", "gpu.fewer-registered", "gpu.sharing-config", "gpu.sharing-not-applied",
            "gpu.mps-daemon-missing", "gpu.hami-missing"):
    if _id in FINDINGS and "doctor" not in FINDINGS[_id].sources:
        FINDINGS[_id] = replace(FINDINGS[_id], sources=(*FINDINGS[_id].sources, "doctor"))


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


def to_json(findings: Sequence[Finding]) -> dict[str, Any]:
    """{"findings": [each finding's object], "summary": {"pass": n, "warn": n, "fail": n, "skip": n}}: the shape
    every command's -o json gives its findings in."""
    return {"findings": [f.to_json() for f in findings], "summary": counts(findings)}


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    """How many findings have each status: {'pass': n, 'warn': n, 'fail': n, 'skip': n}."""
    out: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for f in findings:
        out[f.status] += 1
    return out
