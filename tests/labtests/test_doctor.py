"""gpuk8s status and gpuk8s doctor on the lab (issue 19): one cluster (a control plane, two GPU workers with 2 GPUs
each) installed once; each test produces one cause the way it happens (a pod the scheduler cannot place, a label
removed, the runtime's default changed, a driver broken, an image too new), runs doctor, and checks the finding's
id, evidence and remedy; after --fix (where gpuk8s offers one) doctor finds nothing and a GPU pod runs."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from tests.labtests.gpucluster import KUBECTL, ROOT, STATUS_SCHEMA, Cluster, installed

FLEET = ("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: gpu-1\n    gpus: 2\n"
         "  - name: gpu-2\n    gpus: 2\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from installed(tmp_path_factory, "doctor", FLEET)


def only(doc: dict[str, Any], subject: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f"{f['subject']['kind']}/{f['subject']['name']}" == subject]


def test_status_counts_every_gpu_and_who_holds_it(cluster: Cluster) -> None:
    code, doc = cluster.doctor()
    assert code == 0 and doc["ok"] and doc["findings"] == []  # a fresh cluster: nothing wrong
    cluster.pod("train", {"nvidia.com/gpu": 2})
    cluster.pod("infer", {"nvidia.com/gpu": 1}, ns="kube-public")
    try:
        assert cluster.phase("train")["status"]["phase"] == "Running"
        t0 = time.monotonic()
        r = cluster.cli("status", "-i", cluster.inv, "-o", "json")
        cluster.times["status"] = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        jsonschema.validate(st, STATUS_SCHEMA)
        by = {n["node"]: n for n in st["nodes"]}
        assert set(by) == {"gpu-1", "gpu-2"}  # cp-1 has no GPU
        train_node = cluster.phase("train")["spec"]["nodeName"]
        infer_node = cluster.phase("infer", "kube-public")["spec"]["nodeName"]
        held = {"gpu-1": 0, "gpu-2": 0}
        held[train_node] += 2
        held[infer_node] += 1
        for name, n in by.items():
            [res] = n["resources"]
            assert (res["resource"], res["allocatable"], res["planned"]) == ("nvidia.com/gpu", 2, 2)
            assert res["requested"] == held[name] and res["free"] == 2 - held[name]
        assert {f"{p['namespace']}/{p['name']}" for n in by.values() for p in n["resources"][0]["pods"]} == \
            {"default/train", "kube-public/infer"}
        assert st["footer"] == ["Allocated/Total GPUs in cluster: 3/4 (75%)"]
        r = cluster.cli("status", "-i", cluster.inv, train_node)  # piped: plain lines
        assert r.returncode == 0
        assert f"{train_node}\twhole\tnvidia.com/gpu\t2\t2\t" in r.stdout and "default/train x2" in r.stdout
        assert r.stdout.rstrip().endswith(f"Allocated/Total GPUs in cluster: {held[train_node]}/2 "
                                          f"({held[train_node] * 50}%)")

        # Pending: no node has 2 free GPUs; doctor names who holds them
        cluster.pod("big", {"nvidia.com/gpu": 2})
        code, doc = cluster.doctor()
        assert code == 1
        fs = only(doc, "pod/default/big")
        assert len(fs) == 1, fs
        [f] = fs
        assert f["id"] == "pod.insufficient-gpu" and "held by" in f["message"] and "default/train x2" in f["message"]
        sched = f["evidence"][0]
        assert sched.startswith("scheduler: 0/3 nodes are available: ") and "Insufficient nvidia.com/gpu" in sched
        assert "preemption: 0/3 nodes are available:" in sched
        assert f"{train_node}: 2 nvidia.com/gpu allocatable, 2 requested, 0 free; held by default/train x2" \
            in f["evidence"]
        assert "gpuk8s status" in f["remedy"]
        events = json.loads(cluster.kubectl("get events -A -o json"))["items"]
        assert any(e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "big" for e in events)
        cluster.delete("big")
    finally:
        cluster.delete("train")
        cluster.delete("infer", ns="kube-public")


def test_a_selector_no_gpu_node_matches(cluster: Cluster) -> None:
    cluster.pod("picky", {"nvidia.com/gpu": 1}, nodeSelector={"gpu-type": "h100"})
    try:
        code, doc = cluster.doctor("default/picky")
        assert code == 1 and doc["checked"]["pods"] == ["default/picky"]
        [f] = doc["findings"]
        assert f["id"] == "pod.selector-mismatch"
        assert "didn't match Pod's node affinity/selector" in f["evidence"][0]
        assert "gpu-1: nodeSelector gpu-type=h100 (node has no such label)" in f["evidence"]
        assert "kubectl label node" in f["remedy"]
    finally:
        cluster.delete("picky")


def test_a_gpu_taint_the_pod_does_not_tolerate(cluster: Cluster) -> None:
    for n in ("gpu-1", "gpu-2"):
        cluster.kubectl(f"taint node {n} dedicated=ml:NoSchedule")
    cluster.pod("plain", {"nvidia.com/gpu": 1})
    try:
        code, doc = cluster.doctor("plain")
        assert code == 1 and len(doc["findings"]) == 1, doc["findings"]
        [f] = doc["findings"]
        assert f["id"] == "pod.untolerated-taint" and "{dedicated: ml}" in f["message"]
        assert "2 node(s) had untolerated taint {dedicated: ml}" in f["evidence"][0]
        assert "gpu-2: taint dedicated=ml:NoSchedule not tolerated by the pod" in f["evidence"]
        assert "tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]" in f["remedy"]
        # with the toleration the pod runs
        cluster.pod("tolerant", {"nvidia.com/gpu": 1}, tolerations=[{"key": "dedicated", "operator": "Exists"}])
        assert cluster.phase("tolerant")["status"]["phase"] == "Running"
        cluster.delete("tolerant")
    finally:
        cluster.delete("plain")
        for n in ("gpu-1", "gpu-2"):
            cluster.kubectl(f"taint node {n} dedicated=ml:NoSchedule-")


def test_a_resource_no_node_offers(cluster: Cluster) -> None:
    cluster.pod("gpushare", {"aliyun.com/gpu-mem": 4})
    try:
        code, doc = cluster.doctor()
        assert code == 1
        [f] = only(doc, "pod/default/gpushare")
        assert f["id"] == "pod.unknown-resource"
        assert "Insufficient aliyun.com/gpu-mem" in f["evidence"][0]
        assert "GPU resources the nodes offer: nvidia.com/gpu (gpu-1: 2, gpu-2: 2)" in f["evidence"]
        assert "gpushare" in f["remedy"]
    finally:
        cluster.delete("gpushare")


def test_a_node_without_the_plugin_label_and_the_fix(cluster: Cluster) -> None:
    cluster.kubectl("label node gpu-2 nvidia.com/gpu.present-")
    code, doc = cluster.doctor()
    assert code == 1 and "gpu-2" in doc["checked"]["nodes"]
    [f] = only(doc, "node/gpu-2")
    assert f["id"] == "gpu.plugin-not-scheduled"
    assert "node label nvidia.com/gpu.present: missing" in f["evidence"]
    assert "no pod nvidia-device-plugin-* on node gpu-2" in f["evidence"]
    assert "nvidia.com/gpu.present=true" in f["remedy"]
    r = cluster.cli("doctor", "-i", cluster.inv, "--fix")  # no terminal and no --yes: shown, not applied
    assert r.returncode == 1 and "re-run the gpu phase" in r.stderr and "pass --yes" in r.stderr
    code, doc = cluster.doctor("--fix", "--yes")
    assert code == 0 and doc["findings"] == [], doc
    assert [x["name"] for x in doc["fixes"]] == ["lock", "gpu"] and doc["fixes"][-1]["status"] == "changed"
    cluster.pod("after-label", {"nvidia.com/gpu": 2}, nodeSelector={"nvidia.com/gpu.present": "true"})
    cluster.pod("after-label-2", {"nvidia.com/gpu": 2})
    try:
        assert cluster.phase("after-label")["status"]["phase"] == "Running"
        assert cluster.phase("after-label-2")["status"]["phase"] == "Running"  # both nodes' GPUs are there again
    finally:
        cluster.delete("after-label", "after-label-2")


def test_a_node_whose_runtime_default_is_not_nvidia_and_the_fix(cluster: Cluster) -> None:
    w = cluster.lab.host("gpu-2")
    w.write("/etc/containerd/config.toml", w.read("/etc/containerd/config.toml").replace(
        'default_runtime_name = "nvidia"', 'default_runtime_name = "runc"'))
    # the plugin starts again under it (a reboot): it finds no NVML and waits indefinitely
    cluster.kubectl("delete pod nvidia-device-plugin-daemonset-gpu-2 -n kube-system")
    code, doc = cluster.doctor("node/gpu-2")
    assert code == 1 and doc["checked"]["nodes"] == ["gpu-2"]
    [f] = doc["findings"]
    assert f["id"] == "gpu.runtime-not-nvidia" and "default is runc, not nvidia" in f["message"]
    assert "container runtime default on the host: runc" in f["evidence"]
    assert any("Incompatible platform detected" in e for e in f["evidence"])  # the plugin's own log
    assert any(e.startswith("nvidia-smi: 2 GPU(s), driver 535.104.05") for e in f["evidence"])
    assert "re-run gpuk8s install" in f["remedy"]
    code, doc = cluster.doctor("node/gpu-2", "--fix", "--yes")
    assert code == 0 and doc["findings"] == [], doc
    assert [x["name"] for x in doc["fixes"]] == ["lock", "prepare", "gpu"]
    # the runtime alone would not do: the plugin that started without NVML is restarted under it
    assert "device plugin restarted on gpu-2" in doc["fixes"][-1]["message"]
    assert 'default_runtime_name = "nvidia"' in cluster.lab.host("gpu-2").exec("containerd config dump").stdout
    cluster.pod("after-runtime", {"nvidia.com/gpu": 2})
    cluster.pod("after-runtime-2", {"nvidia.com/gpu": 2})
    try:
        assert cluster.phase("after-runtime-2")["status"]["phase"] == "Running"
    finally:
        cluster.delete("after-runtime", "after-runtime-2")


def test_a_broken_driver(cluster: Cluster) -> None:
    w = cluster.lab.host("gpu-1")
    # nvidia-smi's own words when the kernel module is not loaded (its exit status 9)
    msg = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
           "NVIDIA driver is installed and running.\n")
    w.set_override("nvidia-smi", stdout=msg, exit=9)
    try:
        code, doc = cluster.doctor()
        assert code == 1
        [f] = only(doc, "node/gpu-1")
        assert f["id"] == "gpu.driver"
        assert any("couldn't communicate with the NVIDIA driver" in e for e in f["evidence"])
        assert "driver" in f["remedy"]
    finally:
        w.clear_override("nvidia-smi")
    code, doc = cluster.doctor()
    assert code == 0, doc


def test_an_image_newer_than_the_driver(cluster: Cluster) -> None:
    # the lab's driver 535.104.05 runs CUDA 12.2, as a real one reports (fakes/fake.py CUDA_FOR_DRIVER, from NVIDIA's
    # release notes); a 12.4 image is refused
    cluster.pod("cuda124", {"nvidia.com/gpu": 1}, command=["nvidia-smi"], image="nvidia/cuda:12.4.1-base-ubuntu22.04")
    try:
        st = cluster.phase("cuda124")["status"]
        assert st["phase"] == "Failed"
        code, doc = cluster.doctor()
        assert code == 1
        [f] = only(doc, "pod/default/cuda124")
        assert f["id"] == "pod.cuda-too-new" and "needs CUDA 12.4" in f["message"] and "535.104.05" in f["message"]
        assert any("unsatisfied condition: cuda>=12.4" in e for e in f["evidence"])
        assert "images: nvidia/cuda:12.4.1-base-ubuntu22.04" in f["evidence"]
    finally:
        cluster.delete("cuda124")
    # an image the driver can run (12.2: the lab refused it before, from the driver's major alone): it succeeds,
    # doctor finds nothing
    cluster.pod("cuda120", {"nvidia.com/gpu": 1}, command=["nvidia-smi"], image="nvidia/cuda:12.2.2-base-ubuntu22.04")
    try:
        assert cluster.phase("cuda120")["status"]["phase"] == "Succeeded"
        assert cluster.doctor()[0] == 0
    finally:
        cluster.delete("cuda120")


def test_hami_pods_without_hami(cluster: Cluster) -> None:
    # a pod for HAMi's scheduler, which is not deployed: nobody binds it and no event says why
    cluster.pod("vgpu", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096}, schedulerName="hami-scheduler")
    # a pod asking for HAMi's memory that HAMi's webhook never saw: the default scheduler finds no such resource
    cluster.pod("vgpu-unmutated", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096})
    try:
        code, doc = cluster.doctor()
        assert code == 1
        [f] = only(doc, "pod/default/vgpu")
        assert f["id"] == "pod.scheduler-missing" and "hami-scheduler, which is not deployed" in f["message"]
        assert "scheduler events: none" in f["evidence"]
        [f] = only(doc, "pod/default/vgpu-unmutated")
        assert f["id"] == "pod.scheduler-missing" and "HAMi's webhook did not set schedulerName" in f["message"]
        assert any("Insufficient nvidia.com/gpumem" in e for e in f["evidence"])
    finally:
        cluster.delete("vgpu", "vgpu-unmutated")


def test_a_pod_not_given_the_nvidia_runtime_and_the_fix(cluster: Cluster) -> None:
    # the device plugin run through RuntimeClass nvidia (as the GPU Operator runs it) on a node whose default runtime
    # is runc: the node advertises its GPUs, but a pod without runtimeClassName gets no driver in its container
    ds = json.loads(cluster.kubectl("get daemonset nvidia-device-plugin-daemonset -n kube-system -o json"))
    ds.pop("status", None)
    ds["spec"]["template"]["spec"]["runtimeClassName"] = "nvidia"
    cp = cluster.lab.host("cp-1")
    cp.write("/root/plugin-rc.json", json.dumps(ds))
    cp.exec(KUBECTL + "apply -f /root/plugin-rc.json")
    w = cluster.lab.host("gpu-1")
    w.write("/etc/containerd/config.toml", w.read("/etc/containerd/config.toml").replace(
        'default_runtime_name = "nvidia"', 'default_runtime_name = "runc"'))
    try:
        cluster.pod("smi", {"nvidia.com/gpu": 1}, command=["nvidia-smi"], nodeSelector={"gpu-test": "yes"})
        cluster.kubectl("label node gpu-1 gpu-test=yes")
        st = cluster.phase("smi")["status"]
        assert st["phase"] == "Failed" and st["containerStatuses"][0]["state"]["terminated"]["reason"] == "StartError"
        code, doc = cluster.doctor()
        assert code == 1
        [f] = only(doc, "pod/default/smi")
        assert f["id"] == "pod.no-nvidia-runtime" and "runtime runc, not nvidia" in f["message"]
        assert any('exec: "nvidia-smi": executable file not found' in e for e in f["evidence"])
        assert "pod runtimeClassName: none" in f["evidence"] and "node default runtime: runc" in f["evidence"]
        assert "runtimeClassName: nvidia" in f["remedy"]
        code, doc = cluster.doctor("--fix", "--yes")
        assert code == 0 and doc["findings"] == [], doc
        assert [x["name"] for x in doc["fixes"]][:2] == ["lock", "prepare"]
        cluster.delete("smi")
        cluster.pod("smi", {"nvidia.com/gpu": 1}, command=["nvidia-smi"], nodeSelector={"gpu-test": "yes"})
        assert cluster.phase("smi")["status"]["phase"] == "Succeeded"
    finally:
        cluster.delete("smi")
        cluster.kubectl("label node gpu-1 gpu-test-")
        del ds["spec"]["template"]["spec"]["runtimeClassName"]
        cp.write("/root/plugin-rc.json", json.dumps(ds))
        cp.exec(KUBECTL + "apply -f /root/plugin-rc.json")


def test_a_runtime_handler_the_node_lacks_and_the_fix(cluster: Cluster) -> None:
    # RuntimeClass nvidia exists, but gpu-2's containerd has no nvidia runtime (a config rewritten by hand): the kubelet
    # cannot make the pod's sandbox, the pod stays in ContainerCreating with FailedCreatePodSandBox events (as real
    # ones: tests/fixtures/real/kubernetes/kubelet/sandbox-no-runtime-nvidia-*.txt), never "nothing wrong found"
    w = cluster.lab.host("gpu-2")
    before = w.read("/etc/containerd/config.toml")
    w.write("/etc/containerd/config.toml", 'version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
            '  default_runtime_name = "runc"\n\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
            '  runtime_type = "io.containerd.runc.v2"\n')
    try:
        cluster.pod("rc", {"nvidia.com/gpu": 1}, "gpu-2", command=["nvidia-smi"], runtimeClassName="nvidia")
        st = cluster.phase("rc")["status"]
        assert st["phase"] == "Pending" and st["containerStatuses"][0]["state"]["waiting"]["reason"] == \
            "ContainerCreating"
        code, doc = cluster.doctor()
        assert code == 1
        [f] = only(doc, "pod/default/rc")
        assert f["id"] == "pod.runtime-handler-missing", f
        assert any('no runtime for "nvidia" is configured' in e for e in f["evidence"])
        code, doc = cluster.doctor("--fix", "--yes")
        assert code in (0, 1), doc
        assert [x["name"] for x in doc["fixes"]][:2] == ["lock", "prepare"]
        cluster.delete("rc")
        cluster.pod("rc", {"nvidia.com/gpu": 1}, "gpu-2", command=["nvidia-smi"], runtimeClassName="nvidia")
        assert cluster.phase("rc")["status"]["phase"] == "Succeeded"
    finally:
        cluster.delete("rc")
        if "runtimes.nvidia" not in w.read("/etc/containerd/config.toml"):  # the fix did not run: as it was
            w.write("/etc/containerd/config.toml", before)


def test_no_device_plugin_and_the_fix(cluster: Cluster) -> None:
    cluster.kubectl("delete daemonset nvidia-device-plugin-daemonset -n kube-system")
    code, doc = cluster.doctor()
    assert code == 1
    assert {f["subject"]["name"]: f["id"] for f in doc["findings"]} == {"gpu-1": "gpu.plugin-missing",
                                                                        "gpu-2": "gpu.plugin-missing"}
    f = doc["findings"][0]
    assert "kubectl -n kube-system get daemonset nvidia-device-plugin-daemonset: not found" in f["evidence"]
    code, doc = cluster.doctor("--fix", "--yes")
    assert code == 0 and doc["findings"] == [], doc
    cluster.pod("after-plugin", {"nvidia.com/gpu": 2})
    try:
        assert cluster.phase("after-plugin")["status"]["phase"] == "Running"
    finally:
        cluster.delete("after-plugin")


def test_a_plugin_image_the_node_cannot_pull(cluster: Cluster) -> None:
    w = cluster.lab.host("gpu-2")
    before = w.state().get("unreachable_hosts", [])
    w.update_state(unreachable_hosts=[*before, "nvcr.io"])  # gpu-2 lost its way to NVIDIA's registry
    try:
        code, doc = cluster.doctor()
        assert code == 1
        [f] = only(doc, "node/gpu-2")
        assert f["id"] == "gpu.plugin-image-pull"
        assert "cannot pull the device plugin's image nvcr.io/nvidia/k8s-device-plugin:" in f["message"]
        assert f["message"].endswith("(lookup nvcr.io: no such host)")
        assert any(e.startswith("event: Failed to pull image \"nvcr.io/nvidia/k8s-device-plugin:")
                   and "dial tcp: lookup nvcr.io: no such host" in e for e in f["evidence"])
        assert any("ImagePullBackOff" in e for e in f["evidence"])
        assert "sudo crictl pull nvcr.io/nvidia/k8s-device-plugin:" in f["remedy"]
        assert only(doc, "node/gpu-1") == []  # the other node pulls it
        r = cluster.cli("doctor", "-i", cluster.inv, "--fix", "--yes")  # nothing gpuk8s can fix by itself
        assert r.returncode == 1 and "gpu.plugin-image-pull" in r.stdout
    finally:
        w.update_state(unreachable_hosts=before)
    code, doc = cluster.doctor()
    assert code == 0, doc


def test_a_plugin_that_missed_a_kubelet_restart(cluster: Cluster) -> None:
    w = cluster.lab.host("gpu-1")
    plugins = "ls -1A /var/lib/kubelet/device-plugins"
    assert sorted(w.exec(plugins).stdout.split()) == ["kubelet.sock", "nvidia-gpu.sock"]
    # a socket file removed under a registered plugin changes nothing: the kubelet keeps its stream to it
    w.exec("rm /var/lib/kubelet/device-plugins/nvidia-gpu.sock")
    assert cluster.doctor("node/gpu-1")[0] == 0
    # the kubelet restarts, empties its directory and knows no plugin until each registers again; this plugin
    # misses the new kubelet.sock (the race of bottlerocket-os/bottlerocket issue 4250)
    w.update_state(plugin_misses_kubelet_restart=True)
    try:
        w.exec("systemctl restart kubelet")
        assert w.exec(plugins).stdout.split() == ["kubelet.sock"]
        st = json.loads(cluster.kubectl("get node gpu-1 -o json"))["status"]
        assert st["capacity"]["nvidia.com/gpu"] == "2" and st["allocatable"]["nvidia.com/gpu"] == "0"
        code, doc = cluster.doctor("node/gpu-1")
        assert code == 1
        [f] = doc["findings"]
        assert f["id"] == "gpu.plugin-socket-missing" and "a kubelet restart it missed" in f["message"]
        assert "/var/lib/kubelet/device-plugins: kubelet.sock" in f["evidence"]
        assert "kubectl -n kube-system delete pod nvidia-device-plugin-daemonset-gpu-1" in f["remedy"]
        # the remedy, as --fix applies it: the DaemonSet's new pod serves and registers again
        code, doc = cluster.doctor("node/gpu-1", "--fix", "--yes")
        assert code == 0 and doc["findings"] == [], doc
        assert [(x["name"], x["status"]) for x in doc["fixes"]][1:] == [("plugin-restart", "changed")]
        assert sorted(w.exec(plugins).stdout.split()) == ["kubelet.sock", "nvidia-gpu.sock"]
    finally:
        w.update_state(plugin_misses_kubelet_restart=False)
    # a plugin that sees the kubelet restart registers again by itself
    w.exec("systemctl restart kubelet")
    assert cluster.doctor("node/gpu-1")[0] == 0
    cluster.pod("after-socket", {"nvidia.com/gpu": 2}, nodeSelector={"kubernetes.io/hostname": "gpu-1"})
    try:
        assert cluster.phase("after-socket")["status"]["phase"] == "Running"
    finally:
        cluster.delete("after-socket")


def test_a_toolkit_that_refuses_the_unprivileged_plugin_its_gpus(cluster: Cluster) -> None:
    w = cluster.lab.host("gpu-2")
    # a hardening some sites apply (NVIDIA/k8s-device-plugin issue 856): the runtime's default is still nvidia
    # written through the host's own file system (doctor has looked for the file there before)
    cfg = "/etc/nvidia-container-runtime/config.toml"
    text = ('accept-nvidia-visible-devices-as-volume-mounts = true\n'
            'accept-nvidia-visible-devices-envvar-when-unprivileged = false\n\n'
            '[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig.real"\n')
    existed = w.exec(f"test -e {cfg}", check=False).returncode == 0
    w.exec(f"mkdir -p /etc/nvidia-container-runtime && printf %s {shlex.quote(text)} > {cfg}")
    cluster.kubectl("delete pod nvidia-device-plugin-daemonset-gpu-2 -n kube-system")  # the runtime reads it then
    try:
        code, doc = cluster.doctor("node/gpu-2")
        assert code == 1
        [f] = doc["findings"]
        assert f["id"] == "gpu.plugin-no-nvml" and "ignores NVIDIA_VISIBLE_DEVICES" in f["message"]
        assert "containerd default runtime: nvidia" in f["evidence"]
        assert "/etc/nvidia-container-runtime/config.toml: accept-nvidia-visible-devices-envvar-when-unprivileged " \
            "= false" in f["evidence"]
        assert any("could not load NVML library" in e for e in f["evidence"])  # the plugin's own log
        assert "envvar-when-unprivileged = true" in f["remedy"]
        assert "plugin pod nvidia-device-plugin-daemonset-gpu-2: unprivileged (no CAP_SYS_ADMIN)" in f["evidence"]
        r = cluster.cli("doctor", "-i", cluster.inv, "--fix", "--yes")  # a restart alone would not help
        assert r.returncode == 1 and "none of these causes is one gpuk8s can fix" in r.stderr
    finally:
        w.exec(f"rm -f {cfg}" if not existed else f"sed -i /envvar-when-unprivileged/d {cfg}")
    code, doc = cluster.doctor("node/gpu-2")
    assert code == 1 and doc["findings"][0]["id"] == "gpu.plugin-no-nvml"  # until the plugin starts again
    cluster.kubectl("delete pod nvidia-device-plugin-daemonset-gpu-2 -n kube-system")
    code, doc = cluster.doctor("node/gpu-2")
    assert code == 0, doc


FIXTURES = ROOT / "tests" / "fixtures" / "doctor"


def test_nvml_unknown_error_in_a_running_pod(cluster: Cluster) -> None:
    # the workload's own log (a lab override: an application's output cannot be derived), after a systemctl
    # daemon-reload on a node with the systemd cgroup driver; the node's side is read from the host itself
    cluster.pod("smi-loop", {"nvidia.com/gpu": 1}, log=(FIXTURES / "nvml-unknown.log").read_text())
    try:
        assert cluster.phase("smi-loop")["status"]["phase"] == "Running"
        code, doc = cluster.doctor("smi-loop")
        assert code == 1
        [f] = doc["findings"]
        assert f["id"] == "pod.nvml-unknown-error"
        assert "Failed to initialize NVML: Unknown Error" in f["evidence"][0]
        assert "systemd cgroup driver: yes" in f["evidence"]  # gpuk8s's containerd config: SystemdCgroup = true
        assert any(e.startswith("/dev/char links to NVIDIA devices: ") for e in f["evidence"])
        assert "nvidia-ctk system create-dev-char-symlinks --create-all" in f["remedy"]
    finally:
        cluster.delete("smi-loop")
