"""The lab's simulated Kubernetes: kubeadm, kubectl and a stand-in API server, sharing one cluster state.

What is simulated, and how it decides (so that tests prove gpuk8s's work, not the fake's):
- `kubeadm init` runs kubeadm's fatal preflight checks against the host's real state (swap, ip_forward,
  a running containerd with CRI enabled), writes /etc/kubernetes (admin.conf, kubelet.conf, pki,
  manifests), mints a bootstrap token and a CA hash, and starts a stand-in API server: a process
  listening on ADVERTISE_ADDRESS:6443 inside the control plane's network namespace.
- `kubeadm join` reaches that listener over the lab network and presents its token, CA hash (and
  certificate key for a control plane); the listener checks them against the cluster state. A wrong
  token, a wrong hash or an unreachable port fail with kubeadm's own messages.
- `kubectl` (needs a kubeconfig and a reachable listener) gets nodes, pods and DaemonSets as JSON and
  applies manifests. A node is Ready once a CNI DaemonSet exists. A GPU node shows `nvidia.com/gpu`
  only when the NVIDIA device plugin DaemonSet exists AND that node's container runtime really has nvidia
  as its default runtime (read from the node's own containerd config.toml or daemon.json), or the
  plugin uses RuntimeClass nvidia and the node's runtime has the nvidia handler.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tomllib
import yaml

LAB_ROOT = Path(__file__).resolve().parent.parent
CLUSTER = LAB_ROOT / "cluster"
SPEC = Path("/var/lib/gpuk8s-lab/host.json")
PORT = 6443


def out(text: str) -> None:
    sys.stdout.write(text)


def err(text: str) -> None:
    sys.stderr.write(text)


@contextlib.contextmanager
def cluster_state() -> Iterator[dict[str, Any]]:
    CLUSTER.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER / "state.json", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        state = json.loads(f.read() or "{}")
        yield state
        f.seek(0)
        f.truncate()
        f.write(json.dumps(state, indent=1))


def read_state() -> dict[str, Any]:
    with cluster_state() as s:
        return json.loads(json.dumps(s))


def me() -> dict[str, Any]:
    return json.loads(SPEC.read_text())


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _load_config(path: str | None) -> dict[str, dict[str, Any]]:
    if not path:
        return {}
    docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if isinstance(d, dict)]
    return {d.get("kind", ""): d for d in docs}


def _preflight(h: Any, args: list[str], control_plane: bool) -> list[str]:
    ignored = set((_flag(args, "--ignore-preflight-errors") or "").lower().split(","))
    errors = []
    if h.state.get("swap"):
        errors.append(("Swap", "running with swap on is not supported. Please disable swap"))
    if h.state.get("sysctl", {}).get("net.ipv4.ip_forward") != "1":
        errors.append(("FileContent--proc-sys-net-ipv4-ip_forward",
                       "/proc/sys/net/ipv4/ip_forward contents are not set to 1"))
    runtime = h.spec["runtime"]
    if h.state.get("services", {}).get("containerd" if runtime == "containerd" else "cri-docker") != "active":
        errors.append(("CRI", "container runtime is not running: output: time=\"now\" level=fatal "
                       "msg=\"validate service connection: validate CRI v1 runtime API for endpoint "
                       "\\\"unix:///var/run/containerd/containerd.sock\\\": rpc error: code = Unavailable\""))
    elif runtime == "containerd" and _cri_disabled():
        errors.append(("CRI", "container runtime is not running: output: rpc error: code = Unimplemented desc = "
                       "unknown service runtime.v1.RuntimeService"))
    if control_plane and int(h.spec.get("cpus", 2)) < 2:
        errors.append(("NumCPU", "the number of available CPUs 1 is less than the required 2"))
    for name, target in (("kubelet.conf", "/etc/kubernetes/kubelet.conf"),
                         ("manifests-kube-apiserver.yaml", "/etc/kubernetes/manifests/kube-apiserver.yaml")):
        if Path(target).exists() and (control_plane or name == "kubelet.conf"):
            errors.append((f"FileAvailable--etc-kubernetes-{name}", f"{target} already exists"))
    return [f"\t[ERROR {n}]: {m}" for n, m in errors if n.lower() not in ignored and "all" not in ignored]


def _cri_disabled() -> bool:
    try:
        cfg = tomllib.loads(Path("/etc/containerd/config.toml").read_text())
    except (OSError, ValueError):
        return False
    return any(p in ("cri", "io.containerd.grpc.v1.cri") for p in cfg.get("disabled_plugins", []))


def _fail_preflight(errors: list[str]) -> int:
    err("[preflight] Running pre-flight checks\nerror execution phase preflight: [preflight] Some fatal errors "
        "occurred:\n" + "\n".join(errors) + "\n[preflight] If you know what you are doing, you can make a check "
        "non-fatal with `--ignore-preflight-errors=...`\nTo see the stack trace of this error execute with "
        "--v=5 or higher\n")
    return 1


def new_token() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    pick = lambda n: "".join(secrets.choice(alphabet) for _ in range(n))  # noqa: E731
    return f"{pick(6)}.{pick(16)}"


def _kubeconfig(server: str, user: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": f"{user}@lab",
        "clusters": [{"name": "lab", "cluster": {"server": f"https://{server}",
                                                 "certificate-authority-data": "TEFCLUNB"}}],
        "contexts": [{"name": f"{user}@lab", "context": {"cluster": "lab", "user": user}}],
        "users": [{"name": user, "user": {"client-certificate-data": "TEFCLUNFUlQ=",
                                          "client-key-data": secrets.token_hex(16)}}],
    })


def kubeadm(h: Any, args: list[str]) -> int:
    verb = args[0] if args else ""
    if verb == "version":
        out("v" + h.state.get("packages", {}).get("kubeadm", "1.30.0-1.1").split("-")[0] + "\n")
        return 0
    if verb == "init" and args[1:3] == ["phase", "upload-certs"]:
        key = _load_config(_flag(args, "--config")).get("InitConfiguration", {}).get("certificateKey") \
            or _flag(args, "--certificate-key") or secrets.token_hex(32)
        with cluster_state() as s:
            s["certificate_key"] = key
        out("[upload-certs] Storing the certificates in Secret \"kubeadm-certs\" in the \"kube-system\" Namespace\n"
            f"[upload-certs] Using certificate key:\n{key}\n")
        return 0
    if verb == "init":
        return _init(h, args[1:])
    if verb == "join":
        return _join(h, args[1:])
    if verb == "token" and args[1:2] == ["create"]:
        if not Path("/etc/kubernetes/admin.conf").exists():
            err("failed to load admin kubeconfig: open /etc/kubernetes/admin.conf: no such file or directory\n")
            return 1
        cfg = _load_config(_flag(args, "--config")).get("InitConfiguration", {})
        given = [a for a in args[2:] if re.match(r"^[a-z0-9]{6}\.[a-z0-9]{16}$", a)]
        token = next((t.get("token") for t in cfg.get("bootstrapTokens", []) if t.get("token")), None) \
            or (given[0] if given else new_token())
        with cluster_state() as s:
            s.setdefault("tokens", []).append(token)
            endpoint, ca = s["endpoint"], s["ca_hash"]
        out(f"kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash {ca} \n"
            if "--print-join-command" in args else token + "\n")
        return 0
    if verb == "init" or verb == "upload-certs":
        return 0
    if verb == "reset":
        for p in ("/etc/kubernetes/admin.conf", "/etc/kubernetes/kubelet.conf",
                  "/etc/kubernetes/manifests/kube-apiserver.yaml"):
            with contextlib.suppress(OSError):
                os.unlink(p)
        with cluster_state() as s:
            s.get("nodes", {}).pop(me()["name"], None)
        return 0
    err(f"kubeadm {verb}: not simulated in the lab\n")
    return 1


def _init(h: Any, args: list[str]) -> int:
    cfg = _load_config(_flag(args, "--config"))
    init, cc = cfg.get("InitConfiguration", {}), cfg.get("ClusterConfiguration", {})
    spec = me()
    errors = _preflight(h, args, control_plane=True)
    if errors:
        return _fail_preflight(errors)
    addr = init.get("localAPIEndpoint", {}).get("advertiseAddress") or spec["address"]
    if addr != spec["address"]:
        err(f"error execution phase preflight: unable to bind to {addr}:{PORT}: cannot assign requested address\n")
        return 1
    name = init.get("nodeRegistration", {}).get("name") or spec["name"]
    endpoint = cc.get("controlPlaneEndpoint") or f"{addr}:{PORT}"
    if ":" not in endpoint:
        endpoint += f":{PORT}"
    token = next((t.get("token") for t in init.get("bootstrapTokens", []) if t.get("token")), None) or new_token()
    ca_hash = "sha256:" + hashlib.sha256(secrets.token_bytes(32)).hexdigest()
    cert_key = (init.get("certificateKey") or secrets.token_hex(32)) if "--upload-certs" in args else None
    version = cc.get("kubernetesVersion", "v1.30.0")
    for d in ("/etc/kubernetes/pki", "/etc/kubernetes/manifests"):
        Path(d).mkdir(parents=True, exist_ok=True)
    Path("/etc/kubernetes/pki/ca.crt").write_text("-----BEGIN CERTIFICATE-----\nlab CA\n-----END CERTIFICATE-----\n")
    Path("/etc/kubernetes/manifests/kube-apiserver.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kube-apiserver", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "kube-apiserver", "command": [
            "kube-apiserver", f"--advertise-address={addr}",
            f"--service-cluster-ip-range={cc.get('networking', {}).get('serviceSubnet', '10.96.0.0/12')}"]}]}}))
    for f, user in (("admin.conf", "kubernetes-admin"), ("kubelet.conf", f"system:node:{name}")):
        Path(f"/etc/kubernetes/{f}").write_text(_kubeconfig(endpoint, user))
        os.chmod(f"/etc/kubernetes/{f}", 0o600)
    with cluster_state() as s:
        s.clear()
        s.update({"endpoint": endpoint, "apiserver": f"{addr}:{PORT}", "ca_hash": ca_hash, "tokens": [token],
                  "certificate_key": cert_key, "version": version,
                  "pod_subnet": cc.get("networking", {}).get("podSubnet", ""), "objects": {},
                  "nodes": {name: {"host": spec["name"], "role": "control-plane", "labels": {
                      "node-role.kubernetes.io/control-plane": ""},
                      "taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]}}})
    h.state.setdefault("services", {})["kubelet"] = "active"
    h.save()
    _start_apiserver(addr)
    out("[init] Using Kubernetes version: " + version + "\n[preflight] Running pre-flight checks\n"
        "Your Kubernetes control-plane has initialized successfully!\n\n"
        "To start using your cluster, you need to run the following as a regular user:\n\n"
        "  mkdir -p $HOME/.kube\n  sudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config\n\n")
    if cert_key:
        out(f"[upload-certs] Using certificate key:\n{cert_key}\n\n"
            f"You can now join any number of the control-plane node running the following command on each as root:\n"
            f"\n  kubeadm join {endpoint} --token {token} \\\n\t--discovery-token-ca-cert-hash {ca_hash} \\\n"
            f"\t--control-plane --certificate-key {cert_key}\n\n")
    out(f"Then you can join any number of worker nodes by running the following on each as root:\n\n"
        f"kubeadm join {endpoint} --token {token} \\\n\t--discovery-token-ca-cert-hash {ca_hash} \n")
    return 0


def _start_apiserver(addr: str) -> None:
    fake = Path(__file__).resolve().parent / "fake.py"
    subprocess.Popen([sys.executable, str(fake), "kube-apiserver", addr], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((addr, PORT), timeout=0.5):
            return
        time.sleep(0.05)


def apiserver(addr: str) -> int:
    """The stand-in API server: answers kubeadm join and kubectl's liveness connect on ADDR:6443."""
    srv = socket.create_server((addr, PORT), reuse_port=False)
    while True:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            try:
                line = conn.makefile().readline().strip()
            except OSError:
                continue
            if not line:
                continue
            try:
                req = json.loads(line)
                conn.sendall((json.dumps(_admit(req)) + "\n").encode())
            except (ValueError, OSError, KeyError):
                continue


def _admit(req: dict[str, Any]) -> dict[str, Any]:
    with cluster_state() as s:
        token = req.get("token", "")
        token_id = token.split(".")[0]
        if token not in s.get("tokens", []):
            return {"ok": False, "error": "couldn't validate the identity of the API Server: could not find a JWS "
                    f"signature in the cluster-info ConfigMap for token ID \"{token_id}\""}
        if s["ca_hash"] not in req.get("ca_hashes", []):
            return {"ok": False, "error": "couldn't validate the identity of the API Server: cluster CA found in "
                    "cluster-info ConfigMap is invalid: none of the public keys \"" + s["ca_hash"] + "\" are pinned"}
        if req.get("control_plane") and (not s.get("certificate_key")
                                         or req.get("certificate_key") != s["certificate_key"]):
            return {"ok": False, "error": "error downloading certs: error decoding certificate key: the "
                        "certificate key does not match, or the kubeadm-certs Secret has expired"}
        role = "control-plane" if req.get("control_plane") else "worker"
        s.setdefault("nodes", {})[req["name"]] = {"host": req["host"], "role": role, "labels": {}, "taints": []}
        return {"ok": True}


def _join(h: Any, args: list[str]) -> int:
    cfg = _load_config(_flag(args, "--config")).get("JoinConfiguration", {})
    bt = cfg.get("discovery", {}).get("bootstrapToken", {})
    endpoint = bt.get("apiServerEndpoint") or next((a for a in args if not a.startswith("-") and ":" in a), "")
    token = bt.get("token") or _flag(args, "--token") or ""
    hashes = bt.get("caCertHashes") or [_flag(args, "--discovery-token-ca-cert-hash") or ""]
    control_plane = "controlPlane" in cfg or "--control-plane" in args
    cert_key = (cfg.get("controlPlane") or {}).get("certificateKey") or _flag(args, "--certificate-key")
    spec = me()
    name = cfg.get("nodeRegistration", {}).get("name") or spec["name"]
    errors = _preflight(h, args, control_plane=control_plane)
    if errors:
        return _fail_preflight(errors)
    host, _, port = endpoint.rpartition(":")
    url = f"https://{endpoint}/api/v1/namespaces/kube-public/configmaps/cluster-info?timeout=10s"
    try:
        with socket.create_connection((host, int(port or PORT)), timeout=5) as c:
            c.sendall((json.dumps({"token": token, "ca_hashes": hashes, "control_plane": control_plane,
                                   "certificate_key": cert_key, "name": name, "host": spec["name"]}) + "\n").encode())
            c.settimeout(10)
            reply = json.loads(c.makefile().readline() or "{}")
    except (OSError, ValueError) as e:
        reason = ("connect: connection refused" if isinstance(e, ConnectionRefusedError)
                  else "connect: no route to host" if getattr(e, "errno", None) == errno.EHOSTUNREACH
                  else "i/o timeout")
        err(f"[preflight] Running pre-flight checks\nerror execution phase preflight: couldn't validate the identity "
            f"of the API Server: Get \"{url}\": dial tcp {endpoint}: {reason}\n")
        return 1
    if not reply.get("ok"):
        err(f"[preflight] Running pre-flight checks\nerror execution phase preflight: {reply.get('error')}\n"
            "To see the stack trace of this error execute with --v=5 or higher\n")
        return 1
    Path("/etc/kubernetes/pki").mkdir(parents=True, exist_ok=True)
    Path("/etc/kubernetes/pki/ca.crt").write_text("-----BEGIN CERTIFICATE-----\nlab CA\n-----END CERTIFICATE-----\n")
    Path("/etc/kubernetes/kubelet.conf").write_text(_kubeconfig(endpoint, f"system:node:{name}"))
    os.chmod("/etc/kubernetes/kubelet.conf", 0o600)
    if control_plane:
        Path("/etc/kubernetes/admin.conf").write_text(_kubeconfig(endpoint, "kubernetes-admin"))
        os.chmod("/etc/kubernetes/admin.conf", 0o600)
    h.state.setdefault("services", {})["kubelet"] = "active"
    h.save()
    out("[preflight] Running pre-flight checks\n[kubelet-start] Starting the kubelet\n\n"
        "This node has joined the cluster:\n* Certificate signing request was sent to apiserver and a response "
        "was received.\n* The Kubelet was informed of the new secure connection details.\n")
    return 0


# -- kubectl ----------------------------------------------------------------------------
def _server_from_kubeconfig(args: list[str]) -> str | None:
    path = _flag(args, "--kubeconfig") or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if not Path(path).exists():
        path = "/etc/kubernetes/admin.conf" if os.geteuid() == 0 and _flag(args, "--kubeconfig") is None else path
    try:
        cfg = yaml.safe_load(Path(path).read_text())
        return str(cfg["clusters"][0]["cluster"]["server"]).removeprefix("https://")
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def _host_dir(host: str) -> Path:
    return LAB_ROOT / "hosts" / host / "upper"


def _runtime_handlers(host: str) -> tuple[str | None, set[str]]:
    """(default runtime, runtime handlers) as the node's own container runtime config says."""
    up = _host_dir(host)
    spec = json.loads((up / "var_lib/gpuk8s-lab/host.json").read_text())
    if spec["runtime"] == "docker":
        try:
            d = json.loads((up / "etc/docker/daemon.json").read_text())
        except (OSError, ValueError):
            return "runc", {"runc"}
        return d.get("default-runtime", "runc"), {"runc", *d.get("runtimes", {})}
    try:
        cfg = tomllib.loads((up / "etc/containerd/config.toml").read_text())
    except (OSError, ValueError):
        return "runc", {"runc"}
    plugins = cfg.get("plugins", {})
    c = (plugins.get("io.containerd.grpc.v1.cri") or plugins.get("io.containerd.cri.v1.runtime") or {}).get(
        "containerd", {})
    return c.get("default_runtime_name", "runc"), {"runc", *c.get("runtimes", {})}


def _daemonsets(s: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in s.get("objects", {}).values() if o.get("kind") == "DaemonSet"]


def _device_plugin(s: dict[str, Any]) -> dict[str, Any] | None:
    for ds in _daemonsets(s):
        containers = ds.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        if any("k8s-device-plugin" in str(c.get("image", "")) for c in containers):
            return ds
    return None


def _cni_ready(s: dict[str, Any]) -> bool:
    return any(re.search(r"calico-node|flannel", ds["metadata"]["name"]) for ds in _daemonsets(s))


def _gpus_on(host: str) -> int:
    spec = json.loads((_host_dir(host) / "var_lib/gpuk8s-lab/host.json").read_text())
    state = json.loads((_host_dir(host) / "var_lib/gpuk8s-lab/state.json").read_text())
    if "nvidia-smi" in state.get("overrides", {}):
        return 0  # a broken driver: NVML cannot load
    return int(spec.get("gpus", 0))


def _node_gpus(s: dict[str, Any], node: dict[str, Any]) -> int:
    plugin = _device_plugin(s)
    if plugin is None:
        return 0
    default, handlers = _runtime_handlers(node["host"])
    rc = plugin.get("spec", {}).get("template", {}).get("spec", {}).get("runtimeClassName")
    if not (default == "nvidia" or (rc == "nvidia" and "nvidia" in handlers
                                    and f"RuntimeClass//{rc}" in s.get("objects", {}))):
        return 0  # the plugin runs without NVML: "could not load NVML library"
    return _gpus_on(node["host"])


def node_json(s: dict[str, Any], name: str) -> dict[str, Any]:
    n = s["nodes"][name]
    capacity = {"cpu": "16", "memory": "65536Mi", "pods": "110"}
    gpus = _node_gpus(s, n)
    if _device_plugin(s) is not None and _gpus_on(n["host"]):
        capacity["nvidia.com/gpu"] = str(gpus)
    ready = _cni_ready(s)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **n.get("labels", {})}},
        "spec": {"taints": n.get("taints", [])} if n.get("taints") else {},
        "status": {
            "capacity": capacity, "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "KubeletReady" if ready else "KubeletNotReady",
                            "message": "kubelet is posting ready status" if ready else
                            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                            "message:Network plugin returns error: cni plugin not initialized"}],
            "nodeInfo": {"kubeletVersion": s.get("version", "v1.30.0")},
        },
    }


def _pods(s: dict[str, Any]) -> list[dict[str, Any]]:
    pods = []
    for ds in _daemonsets(s):
        md = ds["metadata"]
        for name, n in s.get("nodes", {}).items():
            phase = "Running"
            if ds is _device_plugin(s) and _gpus_on(n["host"]) and not _node_gpus(s, n):
                phase = "Running"  # it runs, but registers no GPU (logs say NVML could not load)
            pods.append({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": f"{md['name']}-{name}", "namespace": md.get("namespace", "default"),
                                      "labels": ds.get("spec", {}).get("selector", {}).get("matchLabels", {}),
                                      "ownerReferences": [{"kind": "DaemonSet", "name": md["name"]}]},
                         "spec": {"nodeName": name}, "status": {"phase": phase}})
    for o in s.get("objects", {}).values():
        if o.get("kind") == "Pod":
            pods.append({**o, "status": _pod_status(s, o)})
    return pods


def _pod_status(s: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """A GPU test pod runs to completion only on a Ready node with enough allocatable nvidia.com/gpu."""
    spec = pod.get("spec", {})
    terms = (spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
             .get("nodeSelectorTerms", []))
    by_field = [v for t in terms for f in t.get("matchFields", []) if f.get("key") == "metadata.name"
                for v in f.get("values", [])]
    node = (spec.get("nodeName") or spec.get("nodeSelector", {}).get("kubernetes.io/hostname")
            or next(iter(by_field), None))
    want = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
               for c in spec.get("containers", []))
    if node not in s.get("nodes", {}):
        return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": f"0/{len(s.get('nodes', {}))} nodes are available: 1 node(s) "
                "didn't match Pod's node affinity/selector."}]}
    n = node_json(s, node)
    have = int(n["status"]["allocatable"].get("nvidia.com/gpu", 0))
    if spec.get("nodeName") and have < want:  # bound without the scheduler: the kubelet's admission rejects it
        return {"phase": "Failed", "reason": "OutOfnvidia.com/gpu", "message": "Pod was rejected: Node didn't have "
                f"enough resource: nvidia.com/gpu, requested: {want}, used: 0, capacity: {have}"}
    if n["status"]["conditions"][0]["status"] != "True" or have < want:
        why = "Insufficient nvidia.com/gpu" if have < want else "node(s) had untolerated taint"
        return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": f"0/{len(s['nodes'])} nodes are available: 1 {why}."}]}
    return {"phase": "Succeeded", "hostIP": node}


def _key(o: dict[str, Any]) -> str:
    md = o.get("metadata", {})
    namespaced = o.get("kind") not in ("RuntimeClass", "Namespace", "ClusterRole", "ClusterRoleBinding", "Node")
    return f"{o.get('kind')}/{md.get('namespace', 'default') if namespaced else ''}/{md.get('name')}"


def kubectl(h: Any, args: list[str]) -> int:
    if args[:1] == ["version"]:
        out("Client Version: v" + h.state.get("packages", {}).get("kubectl", "1.30.0-1.1").split("-")[0] + "\n")
        return 0
    server = _server_from_kubeconfig(args)
    if server is None:
        err("E1129 memcache.go:265] couldn't get current server API group list: Get \"http://localhost:8080/api\": "
            "dial tcp 127.0.0.1:8080: connect: connection refused\nThe connection to the server localhost:8080 was "
            "refused - did you specify the right host or port?\n")
        return 1
    host, _, port = server.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError:
        err(f"The connection to the server {server} was refused - did you specify the right host or port?\n")
        return 1
    words = [a for i, a in enumerate(args) if not a.startswith("-")
             and not (i and args[i - 1] in ("-o", "-n", "-f", "--namespace", "--kubeconfig", "--output"))]
    verb = words[0] if words else ""
    output = _flag(args, "-o") or _flag(args, "--output") or ""
    if verb == "apply":
        src = _flag(args, "-f") or "-"
        text = sys.stdin.read() if src == "-" else Path(src).read_text()
        docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
        with cluster_state() as s:
            for d in docs:
                k = _key(d)
                existed = k in s.setdefault("objects", {})
                s["objects"][k] = d
                out(f"{d['kind'].lower()}/{d['metadata']['name']} {'configured' if existed else 'created'}\n")
        return 0
    if verb in ("label", "taint") and len(words) >= 3 and words[1] in ("node", "nodes"):
        with cluster_state() as s:
            node = s.get("nodes", {}).get(words[2])
            if node is None:
                err(f"Error from server (NotFound): nodes \"{words[2]}\" not found\n")
                return 1
            for kv in words[3:]:
                if verb == "label":
                    k, _, v = kv.partition("=")
                    if k.endswith("-"):
                        node["labels"].pop(k[:-1], None)
                    else:
                        node["labels"][k] = v
                else:
                    m = re.match(r"^([^=:]+)(?:=([^:]*))?:(\w+)(-?)$", kv)
                    if not m:
                        continue
                    node["taints"] = [t for t in node["taints"] if t["key"] != m.group(1)]
                    if not m.group(4):
                        node["taints"].append({"key": m.group(1), "value": m.group(2) or "", "effect": m.group(3)})
        out(f"node/{words[2]} {'labeled' if verb == 'label' else 'tainted'}\n")
        return 0
    if verb == "logs" and len(words) >= 2:
        s = read_state()
        pod = next((p for p in _pods(s) if p["metadata"]["name"] == words[1]), None)
        if pod is None or pod["status"].get("phase") != "Succeeded":
            err(f"Error from server (BadRequest): container in pod \"{words[1]}\" is waiting to start\n")
            return 1
        host = s["nodes"][pod["status"]["hostIP"]]["host"]
        for i in range(_gpus_on(host)):
            out(f"GPU {i}: NVIDIA (UUID: GPU-{host}-{i:04d}-lab)\n")
        return 0
    if verb == "delete" and len(words) >= 3:
        ns = _flag(args, "-n") or "default"
        with cluster_state() as s:
            kind = {"pod": "Pod", "pods": "Pod"}.get(words[1], words[1])
            for name in words[2:]:
                if s.get("objects", {}).pop(f"{kind}/{ns}/{name}", None) is not None:
                    out(f"{words[1]} \"{name}\" deleted\n")
        return 0
    if verb == "get" and len(words) >= 2:
        s = read_state()
        kind = words[1].split(".")[0]
        items: list[dict[str, Any]]
        if kind in ("nodes", "node", "no"):
            items = [node_json(s, n) for n in s.get("nodes", {})]
        elif kind in ("pods", "pod", "po"):
            items = _pods(s)
        elif kind in ("daemonsets", "daemonset", "ds"):
            items = []
            for ds in _daemonsets(s):
                n = len(s.get("nodes", {}))
                items.append({**ds, "status": {"desiredNumberScheduled": n, "numberReady": n, "numberAvailable": n}})
        else:
            items = [o for o in s.get("objects", {}).values() if o.get("kind", "").lower() + "s" == kind
                     or o.get("kind", "").lower() == kind]
        ns = _flag(args, "-n") or _flag(args, "--namespace")
        if ns and "-A" not in args:
            items = [o for o in items if o["metadata"].get("namespace", ns) == ns]
        if len(words) >= 3:
            items = [o for o in items if o["metadata"]["name"] == words[2]]
            if not items:
                err(f"Error from server (NotFound): {kind} \"{words[2]}\" not found\n")
                return 1
            if output == "json":
                out(json.dumps(items[0], indent=2) + "\n")
                return 0
        if output == "json":
            out(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2) + "\n")
        else:
            for o in items:
                out(o["metadata"]["name"] + "\n")
        return 0
    err(f"kubectl {verb}: not simulated in the lab\n")
    return 1
