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

import base64
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import pickle
import re
import secrets
import shlex
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii as _encode_str  # the C string encoder json.dumps uses
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


# -- what a call costs -------------------------------------------------------------------------------------------
# The simulated API server and kubelets cost in proportion to what a call touches (issue 27: one `kubectl delete
# pod` naming 127 pods at 128 nodes took 11 minutes of CPU, listing 300 pods 24 s). So:
# - the cluster state is read once per call under a shared lock and written (compact JSON, the C encoder) only by
#   a call that changes it, once, however many objects it changes;
# - within a call, what depends only on the state and the hosts' files is computed once: each host file is read
#   and parsed once (containerd's config.toml took ~3 ms a parse, and was parsed per pod per node), each node's
#   status once, the objects indexed by kind once, and the pods' statuses in one pass in creation order
#   (_Placement) instead of a scan of the pods before each pod;
# - a TOML file's parse is kept across calls too, on disk, by the hash of its text (never stale: another text is
#   another key), since `get nodes` at 512 hosts would otherwise parse 512 containerd configs per call.
# _CALL holds one call's memo; kubectl() and kubeadm() start with it empty, cluster_state() empties it when it
# writes (what was computed from the old state is gone with it).
_CALL: dict[Any, Any] = {}
PARSED = LAB_ROOT / "cache" / "parsed"
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where installed: ~10x PyYAML's speed


def new_call() -> None:
    """Forget what an earlier call computed: state, host files, nodes (a fake process may serve more than one)."""
    _CALL.clear()


def _memo(key: Any, make: Any) -> Any:
    """make(), once per call for `key`."""
    try:
        return _CALL[key]
    except KeyError:
        value = _CALL[key] = make()
        return value


def _read(path: Path | str) -> str:
    """A file's text, read once per call; OSError as Path.read_text raises it."""
    key = ("file", str(path))
    hit = _CALL.get(key)
    if hit is None:
        try:
            hit = ("ok", Path(path).read_text())
        except OSError as e:
            hit = ("err", e)
        _CALL[key] = hit
    if hit[0] == "err":
        raise hit[1]
    return str(hit[1])


def _read_json(path: Path | str) -> Any:
    """A JSON file, parsed once per call (the caller must not change what it gets)."""
    key = ("json", str(path))
    hit = _CALL.get(key)
    if hit is None:
        try:
            hit = ("ok", json.loads(_read(path)))
        except (OSError, ValueError) as e:
            hit = ("err", e)
        _CALL[key] = hit
    if hit[0] == "err":
        raise hit[1]
    return hit[1]


def _parse_cached(text: str, fmt: str) -> Any:
    """tomllib.loads or yaml.safe_load of a text, from the on-disk parse cache when that text was parsed before
    (by any call: the key is the text's hash, so a changed file is another key). A parse error goes to the
    caller, as tomllib's or PyYAML's."""
    digest = hashlib.sha1(text.encode()).hexdigest()
    key = (fmt, digest)
    if key in _CALL:
        return _CALL[key]
    cached = PARSED / f"{digest}.{fmt}.pickle"
    try:
        doc = pickle.loads(cached.read_bytes())
    except (OSError, pickle.PickleError, EOFError, ValueError, TypeError, AttributeError):
        doc = tomllib.loads(text) if fmt == "toml" else yaml.load(text, Loader=_YAML_LOADER)
        with contextlib.suppress(OSError):
            PARSED.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(pickle.dumps(doc))
            os.replace(tmp, cached)
    _CALL[key] = doc
    return doc


def _toml_text(text: str) -> dict[str, Any]:
    return dict(_parse_cached(text, "toml"))


def _read_toml(path: Path | str) -> dict[str, Any]:
    """A TOML file, parsed once (OSError when unreadable, ValueError when it is not TOML)."""
    return _toml_text(_read(path))


def _yaml_docs(text: str) -> list[Any]:
    return list(yaml.load_all(text, Loader=_YAML_LOADER))


def _yaml_one(text: str) -> Any:
    """yaml.safe_load of a text, once per call per text (ConfigMap data read for every node)."""
    return _memo(("yaml", text), lambda: yaml.load(text, Loader=_YAML_LOADER))


@contextlib.contextmanager
def cluster_state() -> Iterator[dict[str, Any]]:
    """The cluster state to change: locked for the call, written back once when the block ends."""
    CLUSTER.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER / "state.json", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        state = json.loads(f.read() or "{}")
        yield state
        f.seek(0)
        f.truncate()
        f.write(json.dumps(state, separators=(",", ":")))
    new_call()


def read_state() -> dict[str, Any]:
    """The cluster state to read: parsed under a shared lock (a writer waits), never written back."""
    CLUSTER.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER / "state.json", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        f.seek(0)
        return dict(json.loads(f.read() or "{}"))


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
    docs = [d for d in _yaml_docs(Path(path).read_text()) if isinstance(d, dict)]
    return {d.get("kind", ""): d for d in docs}


def _preflight(h: Any, args: list[str], control_plane: bool) -> list[str]:
    ignored = set((_flag(args, "--ignore-preflight-errors") or "").lower().split(","))
    errors = []
    if h.state.get("swap"):
        errors.append(("Swap", "running with swap on is not supported. Please disable swap"))
    if h.state.get("sysctl", {}).get("net.ipv4.ip_forward") != "1":
        errors.append(("FileContent--proc-sys-net-ipv4-ip_forward",
                       "/proc/sys/net/ipv4/ip_forward contents are not set to 1"))
    socket = _cri_socket(args)
    if socket == CRI_DOCKERD:
        problem = _cri_dockerd_problem(h)
        if problem:
            # kubeadm >= 1.31 talks CRI itself (cmd/kubeadm/app/util/runtime/runtime.go: Connect wraps the error
            # as "failed to create new CRI runtime service"); a socket that is not there, as real kubeadm prints it:
            #   W1008 ... checks.go:1080] [preflight] WARNING: Couldn't create the interface used for talking to
            #   the container runtime: failed to create new CRI runtime service: validate service connection:
            #   validate CRI v1 runtime API for endpoint "unix:///...": rpc error: code = Unavailable desc =
            #   connection error: desc = "transport: Error while dialing: dial unix /...: connect: no such file
            #   or directory"   (quoted in public kubeadm 1.31/1.32 transcripts)
            path = socket.removeprefix("unix://")
            why = (f"failed to create new CRI runtime service: validate service connection: validate CRI v1 runtime "
                   f"API for endpoint \"{socket}\": rpc error: code = Unavailable desc = connection error: desc = "
                   f"\"transport: Error while dialing: dial unix {path}: connect: {problem}\"")
            err(f"W0101 00:00:00.000000    4242 checks.go:1080] [preflight] WARNING: Couldn't create the interface "
                f"used for talking to the container runtime: {why}\n")
            errors.append(("", why))
    elif socket != CRI_CONTAINERD:
        errors.append(("", f"failed to create new CRI runtime service: validate service connection: validate CRI v1 "
                       f"runtime API for endpoint \"{socket}\": rpc error: code = Unavailable desc = connection error: "
                       f"desc = \"transport: Error while dialing: dial unix {socket.removeprefix('unix://')}: connect: "
                       "no such file or directory\""))
    elif h.state.get("services", {}).get("containerd") != "active":
        errors.append(("CRI", "container runtime is not running: output: time=\"now\" level=fatal "
                       "msg=\"validate service connection: validate CRI v1 runtime API for endpoint "
                       "\\\"unix:///var/run/containerd/containerd.sock\\\": rpc error: code = Unavailable\""))
    elif _cri_disabled():
        errors.append(("CRI", "container runtime is not running: output: rpc error: code = Unimplemented desc = "
                       "unknown service runtime.v1.RuntimeService"))
    if control_plane and int(h.spec.get("cpus", 2)) < 2:
        errors.append(("NumCPU", "the number of available CPUs 1 is less than the required 2"))
    for name, target in (("kubelet.conf", "/etc/kubernetes/kubelet.conf"),
                         ("manifests-kube-apiserver.yaml", "/etc/kubernetes/manifests/kube-apiserver.yaml")):
        if Path(target).exists() and (control_plane or name == "kubelet.conf"):
            errors.append((f"FileAvailable--etc-kubernetes-{name}", f"{target} already exists"))
    return [f"\t[ERROR {n}]: {m}" if n else m for n, m in errors
            if (n or "cri").lower() not in ignored and "all" not in ignored]


# kubeadm's known CRI endpoints (cmd/kubeadm/app/constants/constants_unix.go: CRISocketContainerd,
# CRISocketDocker); cri-dockerd's socket unit listens on %t/cri-dockerd.sock, /var/run links to /run
CRI_CONTAINERD = "unix:///var/run/containerd/containerd.sock"
CRI_DOCKERD = "unix:///var/run/cri-dockerd.sock"


class MultipleCRIEndpoints(Exception):
    pass


def _cri_socket(args: list[str]) -> str:
    """The CRI endpoint kubeadm uses: nodeRegistration.criSocket of --config, --cri-socket, else the one it
    finds (containerd's while containerd runs, cri-dockerd's where its socket exists; both: an error)."""
    cfg = _load_config(_flag(args, "--config"))
    given = next((d.get("nodeRegistration", {}).get("criSocket") for d in cfg.values()
                  if d.get("nodeRegistration", {}).get("criSocket")), None) or _flag(args, "--cri-socket")
    if given:
        return str(given) if str(given).startswith("unix://") else "unix://" + str(given)
    found = [s for s, there in ((CRI_CONTAINERD, _service("containerd") == "active"),
                                (CRI_DOCKERD, Path("/var/run/cri-dockerd.sock").is_socket())) if there]
    if len(found) > 1:
        raise MultipleCRIEndpoints(", ".join(found))
    return found[0] if found else CRI_CONTAINERD


def _service(unit: str) -> str:
    try:
        st = json.loads(Path("/var/lib/gpuk8s-lab/state.json").read_text())
    except (OSError, ValueError):
        return "inactive"
    return str(st.get("services", {}).get(unit, "inactive"))


def _cri_dockerd_problem(h: Any) -> str:
    """Why a CRI client cannot talk to cri-dockerd here ("" when it can): its socket is missing, or nothing
    answers on it (socket activation starts cri-docker.service, which needs its binary and a running Docker)."""
    if not Path("/var/run/cri-dockerd.sock").is_socket():
        return "no such file or directory"
    svc = h.state.get("services", {})
    if (svc.get("cri-docker.socket") != "active" or svc.get("docker") != "active"
            or not Path("/usr/local/bin/cri-dockerd").exists()):
        return "connection refused"
    return ""


def _cri_disabled() -> bool:
    try:
        cfg = _read_toml("/etc/containerd/config.toml")
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
    new_call()
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
    if verb in ("init", "join"):
        try:
            return _init(h, args[1:]) if verb == "init" else _join(h, args[1:])
        except MultipleCRIEndpoints as e:
            # cmd/kubeadm/app/util/runtime: DetectCRISocket with more than one known socket on the host, as
            # kubeadm prints it ("found multiple CRI endpoints on the host. Please define which one ...")
            err(f"found multiple CRI endpoints on the host. Please define which one do you wish to use by setting "
                f"the 'criSocket' field in the kubeadm configuration file: {e}\n"
                "To see the stack trace of this error execute with --v=5 or higher\n")
            return 1
    if verb == "config" and args[1:3] == ["images", "list"]:
        return _images_list(h, args[3:])
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
    if verb == "upgrade":
        return _upgrade(h, args[1:])
    if verb == "reset":
        return _reset(h, args[1:])
    err(f"kubeadm {verb}: not simulated in the lab\n")
    return 1


def _pause_version(minor: int) -> str:
    """The pause image tag kubeadm of a minor uses (cmd/kubeadm/app/constants: PauseVersion): 3.9 up to 1.30,
    3.10 from 1.31 (kubernetes/minikube constants_kubeadm_images.go: v1.30.x "3.9", v1.31.x and 1.32 betas
    "3.10"), 3.10.1 from 1.34 (kubeadm 1.34.1's image list names registry.k8s.io/pause:3.10.1; 1.35's
    constants.go: PauseVersion = "3.10.1")."""
    return "3.9" if minor <= 30 else "3.10" if minor <= 33 else "3.10.1"


def _images_list(h: Any, args: list[str]) -> int:
    """kubeadm config images list [--kubernetes-version vX.Y.Z]: the images of that version, one a line."""
    version = _flag(args, "--kubernetes-version") or "v" + h.state.get("packages", {}).get(
        "kubeadm", "1.30.0-1.1").split("-")[0]
    m = re.match(r"^v?1\.([0-9]+)\.[0-9]+$", version)
    if not m:
        err(f"could not fetch a Kubernetes version from the internet: unable to get URL "
            f"\"https://dl.k8s.io/release/{version}.txt\"\n")
        return 1
    cc = _load_config(_flag(args, "--config")).get("ClusterConfiguration", {})
    repo = _flag(args, "--image-repository") or cc.get("imageRepository") or "registry.k8s.io"
    out("".join(f"{i}\n" for i in kubeadm_images(version, repo, (cc.get("dns") or {}).get("imageRepository"))))
    return 0


def kubeadm_images(version: str, repo: str = "registry.k8s.io", dns_repo: str | None = None) -> list[str]:
    """kubeadm's images of `version` from imageRepository `repo`: coredns from dns.imageRepository, else from
    REPO/coredns for registry.k8s.io and REPO itself for another repository (kubeadm's images.go renames only
    the official image; "do not include coredns in the repository, kubeadm already adds it")."""
    m = re.match(r"^v?1\.([0-9]+)", version)
    minor = int(m.group(1)) if m else 30
    v = version if version.startswith("v") else "v" + version
    dns = dns_repo or (f"{repo}/coredns" if repo == "registry.k8s.io" else repo)
    return [*(f"{repo}/{n}:{v}" for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                          "kube-proxy")),
            f"{dns}/coredns:v1.11.3", f"{repo}/pause:{_pause_version(minor)}", f"{repo}/etcd:3.5.15-0"]


def _init(h: Any, args: list[str]) -> int:
    cfg = _load_config(_flag(args, "--config"))
    init, cc = cfg.get("InitConfiguration", {}), cfg.get("ClusterConfiguration", {})
    spec = me()
    errors = _preflight(h, args, control_plane=True)
    version0 = cc.get("kubernetesVersion", "v1.30.0")
    repo = cc.get("imageRepository") or "registry.k8s.io"
    images = kubeadm_images(version0, repo, (cc.get("dns") or {}).get("imageRepository"))
    if not errors:
        # kubeadm's ImagePull preflight check (kubernetes/kubeadm issue 2936 quotes its output)
        for img in images:
            e = pull_error(spec["name"], img)
            if e:
                errors.append(f"\t[ERROR ImagePull]: failed to pull image {img}: output: time=\"2026-11-30T09:00:00Z\" "
                              f"level=fatal msg=\"pulling image: {e}\"\n, error: exit status 1")
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
    _etcd_manifest()
    for f, user in (("admin.conf", "kubernetes-admin"), ("kubelet.conf", f"system:node:{name}")):
        Path(f"/etc/kubernetes/{f}").write_text(_kubeconfig(endpoint, user))
        os.chmod(f"/etc/kubernetes/{f}", 0o600)
    with cluster_state() as s:
        s.clear()
        s.update({"endpoint": endpoint, "apiserver": f"{addr}:{PORT}", "ca_hash": ca_hash, "tokens": [token],
                  "certificate_key": cert_key, "version": version,
                  "pod_subnet": cc.get("networking", {}).get("podSubnet", ""), "objects": {},
                  "kube_proxy_image": images[3],
                  "nodes": {name: {"host": spec["name"], "role": "control-plane", "created": _now(), "labels": {
                      "node-role.kubernetes.io/control-plane": ""},
                      # nodeRegistration.taints replaces kubeadm's default taint when it is set
                      "taints": [{k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None}
                                 for t in init.get("nodeRegistration", {}).get("taints") or []
                                 if isinstance(t, dict) and t.get("key") and t.get("effect")]
                      if init.get("nodeRegistration", {}).get("taints") is not None else
                      [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]}}})
    h.state.setdefault("services", {})["kubelet"] = "active"
    h.save()
    kubelet_started()
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
    srv = socket.create_server((addr, PORT), reuse_port=False, backlog=1024)
    while True:
        try:
            conn, _ = srv.accept()
        except OSError as e:  # ECONNABORTED (a client gone before the accept), EMFILE: never the server's end
            with contextlib.suppress(OSError), (LAB_ROOT / "apiserver-errors.log").open("a") as f:
                f.write(f"{time.time():.3f} {addr} accept: {e!r}\n")
            time.sleep(0.01)
            continue
        with conn:
            conn.settimeout(5)
            try:
                line = conn.makefile(errors="replace").readline(65536).strip()
            except OSError:
                continue
            if not line:
                continue
            try:
                req = json.loads(line)
                conn.sendall((json.dumps(_admit(req)) + "\n").encode())
            except Exception:  # noqa: BLE001 (one bad request never takes the API server down: it serves the lab)
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
        # nodeRegistration.taints of the JoinConfiguration: the node registers with them (the kubelet's
        # --register-with-taints)
        taints = [{k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None}
                  for t in req.get("taints") or [] if isinstance(t, dict) and t.get("key") and t.get("effect")]
        s.setdefault("nodes", {})[req["name"]] = {"host": req["host"], "role": role, "labels": {}, "taints": taints,
                                                  "created": _now()}
        return {"ok": True}


def _etcd_manifest() -> None:
    """The stacked etcd's static pod and data directory, as kubeadm writes them on a control plane (its
    --data-dir is where kubeadm reset finds the directory to clean)."""
    Path("/etc/kubernetes/manifests").mkdir(parents=True, exist_ok=True)
    Path("/etc/kubernetes/manifests/etcd.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "etcd", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "etcd", "command": ["etcd", "--data-dir=/var/lib/etcd"]}]}}))
    Path("/var/lib/etcd/member").mkdir(parents=True, exist_ok=True)
    Path("/var/lib/etcd/member/db").write_text("lab etcd data\n")


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
                                   "certificate_key": cert_key, "name": name, "host": spec["name"],
                                   "taints": cfg.get("nodeRegistration", {}).get("taints")}) + "\n").encode())
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
        _etcd_manifest()
    h.state.setdefault("services", {})["kubelet"] = "active"
    h.save()
    kubelet_started()
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
        cfg = _yaml_one(_read(path))
        cluster = _context_cluster(cfg, _flag(args, "--context"))
        return str(cluster["cluster"]["server"]).removeprefix("https://")
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def _context_cluster(cfg: dict[str, Any], context: str | None) -> dict[str, Any]:
    """The cluster entry of the context kubectl uses: --context, else current-context, else the first cluster."""
    name = context or cfg.get("current-context")
    ctx = next((c for c in cfg.get("contexts") or [] if c.get("name") == name), None)
    if ctx is None:
        if context:
            raise KeyError(context)
        return cfg["clusters"][0]
    return next(c for c in cfg["clusters"] if c.get("name") == ctx["context"]["cluster"])


def _missing_context(args: list[str]) -> str | None:
    """The --context named that the kubeconfig does not have."""
    name = _flag(args, "--context")
    path = _flag(args, "--kubeconfig") or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        cfg = _yaml_one(_read(path))
        names = {c.get("name") for c in cfg.get("contexts") or []}
    except (OSError, ValueError, AttributeError):
        return None
    return name if name and name not in names else None


def _host_dir(host: str) -> Path:
    return LAB_ROOT / "hosts" / host / "upper"


def _hp(host: str, rel: str) -> str:
    """The path of a file of the host's upper layer, as a string (the key _read caches it by: a Path per read of
    per node per call cost more than the read)."""
    return f"{LAB_ROOT}/hosts/{host}/upper/{rel}"


def _runtime_handlers(host: str) -> tuple[str | None, set[str]]:
    """(default runtime, runtime handlers) as the node's own container runtime config says."""
    return _memo(("handlers", host), lambda: _read_handlers(host))  # type: ignore[no-any-return]


def _containerd_docs(host: str) -> list[dict[str, Any]] | None:
    """config.toml, then its imports in order (the toolkit's drop-in /etc/containerd/conf.d/99-nvidia.toml since
    1.18): a later file's value wins, as containerd merges them. None where config.toml cannot be read (not TOML)."""
    try:
        cfg = _read_toml(_hp(host, "etc/containerd/config.toml"))
    except (OSError, ValueError):
        return None
    docs = [cfg]
    for pattern in cfg.get("imports", []):
        base = _host_dir(host) / str(pattern).lstrip("/")
        for f in sorted(base.parent.glob(base.name)) if str(pattern).startswith("/etc/") and base.parent.is_dir() \
                else []:
            with contextlib.suppress(OSError, ValueError):
                docs.append(_read_toml(f))
    return docs


def _read_handlers(host: str) -> tuple[str | None, set[str]]:
    spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
    if spec["runtime"] == "docker":
        try:
            d = _read_json(_hp(host, "etc/docker/daemon.json"))
        except (OSError, ValueError):
            return "runc", {"runc"}
        return d.get("default-runtime", "runc"), {"runc", *d.get("runtimes", {})}
    docs = _containerd_docs(host)
    if docs is None:
        return "runc", {"runc"}
    default, handlers = "runc", {"runc"}
    for d in docs:
        plugins = d.get("plugins", {})
        c = (plugins.get("io.containerd.grpc.v1.cri") or plugins.get("io.containerd.cri.v1.runtime") or {}).get(
            "containerd", {})
        default = c.get("default_runtime_name", default)
        handlers |= set(c.get("runtimes", {}))
    return default, handlers


# -- image pulls (issue 21: mirrors) ---------------------------------------------------------------------
# The kubelet asks containerd to pull each image of a pod (and the sandbox image first). containerd resolves
# the image's registry through /etc/containerd/certs.d/REGISTRY/hosts.toml when the CRI images service's
# registry config_path points there (containerd docs/hosts.md: the [host."URL"] entries in order, then
# `server`; override_path: the URL's path is the API root), else straight from the registry. A registry host in
# the node's unreachable_hosts does not resolve; a lab registry (LAB_ROOT/registries.json: {host: [image
# references it holds]}) serves only what was copied into it; any other registry serves every image.
REGISTRIES = LAB_ROOT / "registries.json"


def _ref_parts(ref: str) -> tuple[str, str, str]:
    """(registry, path, tag with its separator) as containerd's reference.ParseDockerRef reads a name."""
    name, tag = ref, ""
    if "@" in name:
        name, digest = name.split("@", 1)
        tag = "@" + digest
    if ":" in name.rsplit("/", 1)[-1]:
        name, t = name.rsplit(":", 1)
        tag = f":{t}{tag}"
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return "docker.io", (name if rest else f"library/{name}"), tag


def _containerd_cfg(host: str) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        return _read_toml(_hp(host, "etc/containerd/config.toml"))
    return {}


def sandbox_image(host: str) -> str:
    """The pause image the node's containerd runs each pod sandbox with (its own default where unset:
    registry.k8s.io/pause:3.8 in containerd 1.7, 3.10 in 2.x)."""
    plugins = _containerd_cfg(host).get("plugins", {})
    v3 = plugins.get("io.containerd.cri.v1.images", {}).get("pinned_images", {}).get("sandbox")
    v2 = plugins.get("io.containerd.grpc.v1.cri", {}).get("sandbox_image")
    return v3 or v2 or "registry.k8s.io/pause:3.8"


def _hosts_dir(host: str) -> str | None:
    plugins = _containerd_cfg(host).get("plugins", {})
    for pid in ("io.containerd.cri.v1.images", "io.containerd.grpc.v1.cri"):
        cp = plugins.get(pid, {}).get("registry", {}).get("config_path")
        if cp:
            return str(cp)
    return None


def _endpoints(host: str, registry: str) -> list[tuple[str, bool]]:
    """(URL, override_path) containerd tries for `registry` on this node, in order."""
    server = "https://registry-1.docker.io" if registry == "docker.io" else f"https://{registry}"
    d = _hosts_dir(host)
    if not d:
        return [(server, False)]
    f = _host_dir(host) / d.lstrip("/") / registry / "hosts.toml"
    try:
        cfg = _read_toml(f)
    except (OSError, ValueError):
        return [(server, False)]
    out = [(str(u), bool(h.get("override_path"))) for u, h in (cfg.get("host") or {}).items()
           if "pull" in h.get("capabilities", ["pull", "resolve", "push"])]
    return [*out, (str(cfg.get("server", server)), False)]


_IPV4 = re.compile(r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$")
_ACCEPT = ", ".join(["application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                     "application/vnd.docker.distribution.manifest.list.v2+json",
                     "application/vnd.docker.distribution.manifest.v2+json"])


def _real_head(url: str, full: str, netloc: str) -> str | None:
    """containerd's resolve of a real registry: HEAD of the manifest; its error's words, None when found."""
    import urllib.error
    import urllib.request
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD", headers={"Accept": _ACCEPT}),
                               timeout=10).close()
        return None
    except urllib.error.HTTPError as e:
        return f"{full}: not found" if e.code == 404 else f"unexpected status from HEAD request to {url}: {e.code}"
    except (urllib.error.URLError, OSError):
        return f'failed to do request: Head "{url}": dial tcp {netloc}: connect: connection refused'


def pull_error(host: str, ref: str) -> str | None:
    """containerd's error pulling `ref` on the node of lab host `host`, or None when the pull succeeds."""
    return _memo(("pull", host, ref), lambda: _pull_error(host, ref))  # type: ignore[no-any-return]


def _pull_error(host: str, ref: str) -> str | None:
    registry, path, tag = _ref_parts(ref)
    state = _read_json(_hp(host, "var_lib/gpuk8s-lab/state.json"))
    unreachable = set(state.get("unreachable_hosts", []))
    try:
        held = _read_json(REGISTRIES)
    except (OSError, ValueError):
        held = {}
    full = f"{registry}/{path}{tag}"
    problem = None
    for url, override in _endpoints(host, registry):
        netloc = re.sub(r"^[a-z]+://", "", url).split("/", 1)[0]
        name = netloc.split(":", 1)[0]
        prefix = re.sub(r"^[a-z]+://[^/]*", "", url).strip("/")
        prefix = prefix[3:] if override and prefix.startswith("v2/") else prefix
        repo = f"{prefix}/{path}" if prefix else path
        manifest = f"{url.rstrip('/')}{'' if override else '/v2'}/{repo}/manifests/{tag.lstrip(':@') or 'latest'}"
        if name in unreachable:
            # containerd (kubernetes/kubeadm issue 2936; rancher/k3os issue 431: "dial tcp: lookup HOST")
            problem = f'failed to do request: Head "{manifest}": dial tcp: lookup {name}: no such host'
            continue
        if netloc in held and f"{netloc}/{repo}{tag}" not in held[netloc]:
            problem = f"{full}: not found"  # containerd's resolver: "<ref>: not found" (errdefs.ErrNotFound)
            continue
        if _IPV4.match(name):  # a real registry (a bundle served from a lab host): asked for real, once: the
            # node's containerd keeps what it pulled (its image store), so a pod of it starts again when the
            # registry is gone (the bundle's server ends with the run that served it)
            store = Path(_hp(host, "var_lib/gpuk8s-lab/pulled.json"))
            with contextlib.suppress(OSError, ValueError):
                if full in json.loads(store.read_text()):
                    problem = None
                    break
            problem = _real_head(manifest + ("" if netloc == registry else f"?ns={registry}"), full, netloc)
            if problem:
                continue
            with contextlib.suppress(OSError, ValueError):
                have = json.loads(store.read_text()) if store.exists() else []
                store.write_text(json.dumps(sorted({*have, full})))
        problem = None
        break
    return (f'failed to pull and unpack image "{full}": failed to resolve reference "{full}": {problem}'
            if problem else None)


def pod_pull_error(host: str, spec: dict[str, Any]) -> tuple[str, str] | None:
    """(image, error) of the first image of a pod spec (sandbox first) that this node cannot pull."""
    sandbox = sandbox_image(host)
    e = pull_error(host, sandbox)
    if e:
        return sandbox, e
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        img = str(c.get("image", ""))
        e = pull_error(host, img) if img else None
        if e:
            return img, e
    return None


def pull_backoff_status(image: str, node: str | None = None, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod whose image cannot be pulled: Pending, the container of that image waiting in ImagePullBackOff with
    the kubelet's message (kubernetes-sigs/node-feature-discovery issue 1229: 'Back-off pulling image "..."'); an
    init container's failure leaves the containers after it waiting in PodInitializing."""
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}}
    inits = [c for c in (spec or {}).get("initContainers") or [] if c.get("image") == image]
    mains = [c for c in (spec or {}).get("containers") or []]
    st: dict[str, Any] = {"phase": "Pending"}
    if inits:
        st["initContainerStatuses"] = [{"name": inits[0].get("name", "init"), "ready": False, "restartCount": 0,
                                        "image": image, "state": waiting}]
        st["containerStatuses"] = [{"name": c.get("name", "main"), "ready": False, "restartCount": 0,
                                    "image": c.get("image", ""), "state": {"waiting": {"reason": "PodInitializing"}}}
                                   for c in mains]
    else:
        failing = next((c for c in mains if c.get("image") == image), {"name": "main"})
        st["containerStatuses"] = [{"name": failing.get("name", "main"), "ready": False, "restartCount": 0,
                                    "image": image, "state": waiting}]
    if node:
        st["hostIP"] = node
    return st


def _ds_pull(s: dict[str, Any], ds: dict[str, Any] | None, node: dict[str, Any]) -> tuple[str, str] | None:
    if ds is None:
        return None
    return pod_pull_error(node["host"], ds.get("spec", {}).get("template", {}).get("spec", {}))


def _of_kind(s: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The stored objects of a kind, in creation order: the objects indexed once per call (a scan of every object
    for every pod or node was the quadratic part of a large cluster)."""
    def index() -> dict[str, list[dict[str, Any]]]:
        by: dict[str, list[dict[str, Any]]] = {}
        for o in s.get("objects", {}).values():
            by.setdefault(str(o.get("kind")), []).append(o)
        return by
    return _memo(("kinds", id(s)), index).get(kind, [])  # type: ignore[no-any-return]


def _named(s: dict[str, Any], kind: str, name: str) -> bool:
    """Whether an object of that kind and name exists (any namespace)."""
    names = _memo(("names", id(s), kind), lambda: {o.get("metadata", {}).get("name") for o in _of_kind(s, kind)})
    return name in names


def _daemonsets(s: dict[str, Any]) -> list[dict[str, Any]]:
    return _of_kind(s, "DaemonSet")


def _device_plugin(s: dict[str, Any]) -> dict[str, Any] | None:
    return _memo(("device-plugin", id(s)), lambda: _find_device_plugin(s))  # type: ignore[no-any-return]


def _find_device_plugin(s: dict[str, Any]) -> dict[str, Any] | None:
    for ds in _daemonsets(s):
        containers = ds.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        if any("k8s-device-plugin" in str(c.get("image", "")) and c.get("command", ["nvidia-device-plugin"])[:1]
               in (["nvidia-device-plugin"], ["config-manager"]) for c in containers) and not _is_mps_daemon(ds):
            return ds
    return None


# -- shared GPUs: the plugin's config-manager and named configs, its MPS control daemon, HAMi -----------------
# What decides (so that the lab proves gpuk8s's manifests, not itself): a node runs a DaemonSet's pod only where
# its nodeSelector and required node affinity match the node's labels; the plugin's config-manager selects the
# config named by the node's label (NODE_LABEL, else DEFAULT_CONFIG) from the ConfigMap mounted as
# available-configs; that config's sharing.timeSlicing / sharing.mps (replicas, renameByDefault) decides what the
# node advertises; an MPS config without an MPS control daemon pod on the node leaves the plugin crash-looping.
def _pod_spec(ds: dict[str, Any]) -> dict[str, Any]:
    return dict(ds.get("spec", {}).get("template", {}).get("spec", {}) or {})


def _is_mps_daemon(ds: dict[str, Any]) -> bool:
    return any(c.get("command", [])[:1] == ["mps-control-daemon"] for c in _pod_spec(ds).get("containers", []))


def _is_hami_plugin(ds: dict[str, Any]) -> bool:
    return any("projecthami/hami" in str(c.get("image", "")) and c.get("command", [])[:1] == ["nvidia-device-plugin"]
               for c in _pod_spec(ds).get("containers", []))


def _runs_on(ds: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the DaemonSet's pods land on a node with these labels (nodeSelector, required affinity)."""
    spec = _pod_spec(ds)
    if any(labels.get(k) != str(v) for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    terms = (spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution",
                                                                   {}).get("nodeSelectorTerms", []))

    def match(e: dict[str, Any]) -> bool:
        op, key, values = e.get("operator"), e.get("key"), [str(v) for v in e.get("values", [])]
        return {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}.get(str(op), False)

    return not terms or any(all(match(e) for e in t.get("matchExpressions", [])) for t in terms)


def _node_labels(name: str, n: dict[str, Any]) -> dict[str, str]:
    return {"kubernetes.io/hostname": name, **n.get("labels", {})}


def _selected_config(s: dict[str, Any], ds: dict[str, Any],
                     labels: dict[str, str]) -> tuple[dict[str, Any] | None, str]:
    """(the config file config-manager writes for this node, why it cannot); (None, "") without config-manager."""
    spec = _pod_spec(ds)
    managers = [c for c in spec.get("initContainers", []) + spec.get("containers", [])
                if c.get("command", [])[:1] == ["config-manager"]]
    if not managers:
        return None, ""
    env = {e["name"]: str(e.get("value", "")) for e in managers[0].get("env", []) if "value" in e}
    cm_name = next((v["configMap"].get("name") for v in spec.get("volumes", [])
                    if v.get("name") == "available-configs" and isinstance(v.get("configMap"), dict)), "")
    ns = ds["metadata"].get("namespace", "default")
    cm = s.get("objects", {}).get(f"ConfigMap/{ns}/{cm_name}")
    if cm is None:  # the kubelet cannot mount the volume (kubelet volume manager's message)
        return {}, f"MountVolume.SetUp failed for volume \"available-configs\" : configmap \"{cm_name}\" not found"
    name = labels.get(env.get("NODE_LABEL", "")) or env.get("DEFAULT_CONFIG", "")
    data = cm.get("data") or {}
    if name not in data:  # cmd/config-manager/main.go updateConfigName
        return {}, f"error setting up config: specified config {name} does not exist"
    return _yaml_one(data[name]) or {}, ""


def _sharing(config: dict[str, Any] | None) -> dict[str, Any]:
    """strategy, replicas, renamed resource name, failRequestsGreaterThanOne of a plugin config file."""
    sharing = (config or {}).get("sharing") or {}
    for key, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
        rr = sharing.get(key) or {}
        listed = rr.get("resources") or []
        # nvidia.com/gpu, else (migStrategy mixed) the first nvidia.com/mig-* it names; `names`: all it replicates
        res = next((r for r in listed if r.get("name") == "nvidia.com/gpu"), None) or next(
            (r for r in listed if str(r.get("name", "")).startswith("nvidia.com/mig-")), None)
        if res:
            name = str(res.get("name"))
            return {"strategy": strategy, "replicas": int(res.get("replicas", 1)),
                    "resource": "nvidia.com/gpu.shared" if rr.get("renameByDefault") and name == "nvidia.com/gpu"
                    else name, "names": [str(r.get("name")) for r in listed],
                    "fail_gt1": bool(rr.get("failRequestsGreaterThanOne"))}
    return {"strategy": "none", "replicas": 1, "resource": "nvidia.com/gpu", "fail_gt1": False}


def _mps_daemon_on(s: dict[str, Any], labels: dict[str, str]) -> bool:
    return any(_is_mps_daemon(ds) and _runs_on(ds, labels) and _pod_spec(ds).get("hostPID") for ds in _daemonsets(s))


def _plugin_on_node(s: dict[str, Any], name: str, n: dict[str, Any]) -> dict[str, Any]:
    """What the NVIDIA plugin does on this node: runs?, the resource and count it registers, its failure."""
    return _memo(("plugin-on", id(s), name), lambda: _plugin_on(s, name, n))  # type: ignore[no-any-return]


def _plugin_on(s: dict[str, Any], name: str, n: dict[str, Any]) -> dict[str, Any]:
    plugin = _device_plugin(s)
    labels = _node_labels(name, n)
    if plugin is None or not _runs_on(plugin, labels):
        return {"runs": False}
    if _ds_pull(s, plugin, n):  # its image cannot be pulled: the pod waits in ImagePullBackOff
        return {"runs": False}
    config, error = _selected_config(s, plugin, labels)
    sh = _sharing(config)
    if not error and sh["strategy"] == "mps" and not _mps_daemon_on(s, labels):
        # internal/plugin/mps.go waitForDaemon and cmd/mps-control-daemon/mps/daemon.go AssertHealthy
        error = ("error waiting for MPS daemon: error checking MPS daemon health: failed to send command to MPS "
                 "daemon: exit status 1")
    return {"runs": True, "error": error, **sh, "mig": str(((config or {}).get("flags") or {}).get("migStrategy")
                                                          or "none"), "config": config or {}}


def _mig_devices(host: str) -> dict[int, list[str] | None]:
    """Per GPU of the host: None when MIG mode is off (a whole GPU), else the profiles of its MIG devices (GPU
    instances with a compute instance), as the faked nvidia-smi keeps them (fakes/fake.py state["mig"])."""
    return {i: None if gis is None else [p for _, p in gis] for i, gis in _mig_instances(host).items()}


def _mig_instances(host: str) -> dict[int, list[tuple[int, str]] | None]:
    """As _mig_devices, with each GPU instance's id: (GPU_I_ID, profile)."""
    spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
    state = _read_json(_hp(host, "var_lib/gpuk8s-lab/state.json"))
    on = 1 if spec.get("mig") == "Enabled" else 0
    out: dict[int, list[tuple[int, str]] | None] = {}
    for i in range(int(spec.get("gpus", 0))):
        g = (state.get("mig") or {}).get(str(i)) or {"current": on, "gis": []}
        out[i] = [(int(gi.get("id", 0)), gi["profile"]) for gi in g.get("gis", []) if gi.get("cis")] \
            if g.get("current") else None
    return out


def _mig_capacity(host: str, p: dict[str, Any]) -> dict[str, str]:
    """What the plugin registers under migStrategy single or mixed (k8s-device-plugin internal/rm, as its labeler
    internal/lm/mig-strategy.go reads the devices): single: every GPU in MIG mode with one profile and no empty
    MIG GPU, else nothing (the plugin refuses the node's devices); with no MIG GPU at all, whole GPUs. mixed:
    nvidia.com/mig-<profile> per MIG device (MIG GPUs without devices are ignored), whole GPUs as nvidia.com/gpu.
    Time-slicing multiplies the resources its config names."""
    devs = _mig_devices(host)
    ts = ((p.get("config") or {}).get("sharing") or {}).get("timeSlicing") or {}
    replicas = {r.get("name"): int(r.get("replicas", 1)) for r in ts.get("resources") or []}
    migs = [d for d in devs.values() if d is not None]
    whole = sum(1 for d in devs.values() if d is None)
    if p["mig"] == "single":
        profiles = {x for d in migs for x in d}
        if not migs:
            return {"nvidia.com/gpu": str(whole * replicas.get("nvidia.com/gpu", 1))}
        if whole or len(profiles) != 1 or any(not d for d in migs):
            return {"nvidia.com/gpu": "0"}
        return {"nvidia.com/gpu": str(sum(len(d) for d in migs) * replicas.get("nvidia.com/gpu", 1))}
    out: dict[str, int] = {}
    for d in migs:
        for x in d:
            name = "nvidia.com/mig-" + x.replace("+", ".")
            out[name] = out.get(name, 0) + 1
    if whole:
        out["nvidia.com/gpu"] = whole
    return {k: str(v * replicas.get(k, 1)) for k, v in out.items()}


def _hami_split(s: dict[str, Any]) -> int:
    cm = next((o for o in _of_kind(s, "ConfigMap") if o["metadata"]["name"] == "hami-scheduler-device"), None)
    try:
        return int(_yaml_one(cm["data"]["device-config.yaml"])["nvidia"]["deviceSplitCount"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return 10  # HAMi's default (charts/hami/values.yaml)


def _hami_devices(s: dict[str, Any], n: dict[str, Any]) -> list[dict[str, Any]]:
    """The node's GPUs as HAMi's device plugin registers them (hami.io/node-nvidia-register, its JSON form), with the
    UUIDs the lab's nvidia-smi prints."""
    host = n["host"]
    spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
    model = spec.get("gpu_model")
    return [{"id": f"GPU-{host}-{i:04d}-lab", "index": i, "count": _hami_split(s),
             "devmem": int(spec.get("gpu_memory_mib", 0)), "devcore": 100,
             "type": f"NVIDIA-{model}" if model else "NVIDIA", "numa": 0, "health": True}
            for i in range(_gpus_on(host))]


def _hami_on(s: dict[str, Any], name: str, n: dict[str, Any]) -> bool:
    return _memo(("hami-on", id(s), name), lambda: any(  # type: ignore[no-any-return]
        _is_hami_plugin(ds) and _runs_on(ds, _node_labels(name, n)) and not _ds_pull(s, ds, n)
        for ds in _daemonsets(s)))


def _cni_ready(s: dict[str, Any]) -> bool:
    return _memo(("cni", id(s)), lambda: any(  # type: ignore[no-any-return]
        re.search(r"calico-node|flannel", ds["metadata"]["name"]) for ds in _daemonsets(s)))


def _gpus_on(host: str) -> int:
    spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
    state = _read_json(_hp(host, "var_lib/gpuk8s-lab/state.json"))
    if "nvidia-smi" in state.get("overrides", {}):
        return 0  # a broken driver: NVML cannot load
    d = state.get("driver")
    if d is None and not spec.get("driver"):
        return 0  # a bare server: no driver at all
    if d is not None and (not d.get("loaded") or (d.get("libraries") and d["libraries"] != d["loaded"])):
        return 0  # no module loaded, or a module of another version than the libraries: NVML cannot initialise
    lost = (state.get("health") or {}).get("lost") or []  # a GPU off the bus: the plugin lists the others
    return max(0, int(spec.get("gpus", 0)) - len(lost))


# The device plugin's health check (NVIDIA/k8s-device-plugin internal/rm/health.go): an Xid event on a GPU marks it
# unhealthy, except the Xids it skips by default (13, 31, 43, 45, 68, 109: application errors); the kubelet keeps the
# GPU in capacity and drops it from allocatable.
PLUGIN_SKIPPED_XIDS = {13, 31, 43, 45, 68, 109}


def _xid_sick(host: str) -> dict[int, int]:
    """GPU index -> the first Xid the plugin counts against it, from the host's health (tests/lab/fleet.py). A GPU
    off the bus is not among the plugin's devices (_gpus_on leaves it out, as NVML does for a plugin started after
    the GPU was lost): its Xid marks nothing."""
    state = _read_json(_hp(host, "var_lib/gpuk8s-lab/state.json"))
    lost = {int(g) for g in (state.get("health") or {}).get("lost") or []}
    out: dict[int, int] = {}
    for e in (state.get("health") or {}).get("xid") or []:
        if int(e["xid"]) not in PLUGIN_SKIPPED_XIDS and int(e["gpu"]) not in lost:
            out.setdefault(int(e["gpu"]), int(e["xid"]))
    return out


def _sys_admin(ds: dict[str, Any]) -> bool:
    """The toolkit takes a container for privileged when it has CAP_SYS_ADMIN (nvidia-container-toolkit
    internal/config/image/privileged.go)."""
    for c in _pod_spec(ds).get("containers") or []:
        sc = c.get("securityContext") or {}
        if sc.get("privileged") or "SYS_ADMIN" in ((sc.get("capabilities") or {}).get("add") or []):
            return True
    return False


def _envvar_refused(host: str) -> bool:
    """accept-nvidia-visible-devices-envvar-when-unprivileged = false in the host's toolkit config: the runtime
    ignores NVIDIA_VISIBLE_DEVICES (which the plugin's image sets) in an unprivileged container."""
    with contextlib.suppress(OSError, ValueError):
        cfg = _read_toml(_hp(host, "etc/nvidia-container-runtime/config.toml"))
        return cfg.get("accept-nvidia-visible-devices-envvar-when-unprivileged") is False
    return False


def _node_gpus(s: dict[str, Any], node: dict[str, Any]) -> int:
    plugin = _device_plugin(s)
    if plugin is None:
        return 0
    default, handlers = _runtime_handlers(node["host"])
    rc = plugin.get("spec", {}).get("template", {}).get("spec", {}).get("runtimeClassName")
    if not (default == "nvidia" or (rc == "nvidia" and "nvidia" in handlers
                                    and f"RuntimeClass//{rc}" in s.get("objects", {}))):
        return 0  # the plugin runs without NVML: "could not load NVML library"
    if _envvar_refused(node["host"]) and not _sys_admin(plugin):
        return 0  # no driver injected into the unprivileged plugin (NVIDIA/k8s-device-plugin issue 856)
    return _gpus_on(node["host"])


# -- the kubelet's device-plugin directory (gpuk8s doctor, issue 19) -----------------------------------------
# The kubelet serves its Registration service on kubelet.sock in /var/lib/kubelet/device-plugins/ (kubelet
# pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go: on start it removes the stale sockets there, then listens).
# A device plugin listens on its own socket there and registers it (k8s-device-plugin internal/plugin/server.go:
# DevicePluginPath + "nvidia-" + name + ".sock", where name is the resource's name after "nvidia.com/": gpu,
# gpu.shared, mig-1g.10gb; it logs "Starting to serve '...' on ..." then "Registered device plugin for '...' with
# Kubelet", and removes its socket when it stops). A kubelet that restarts empties the directory and knows no
# plugin until each registers again (the plugin's watcher sees the new kubelet.sock and starts again; one that
# misses it, bottlerocket-os/bottlerocket issue 4250, leaves the node its capacity but 0 allocatable until the
# plugin pod restarts). The lab makes the sockets when the plugin's pod (re)starts: a new template or config, a
# deleted pod, a new kubelet.sock.
DEVICE_PLUGINS = "var_lib/kubelet/device-plugins"


def _mksock(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mknod(path, 0o755 | stat.S_IFSOCK)


def kubelet_started() -> None:
    """The kubelet (re)started on this host: its device-plugin directory holds only its own fresh socket."""
    d = Path("/var/lib/kubelet/device-plugins")
    _empty_dir(str(d))
    _mksock(d / "kubelet.sock")


def plugin_socket(resource: str) -> str:
    return "nvidia-" + resource.split("/", 1)[1] + ".sock"


def _plugin_start(s: dict[str, Any], name: str, n: dict[str, Any]) -> dict[str, Any]:
    """The NVIDIA plugin's pod on this node as it started: {'key', 'nvml', 'sockets', 'kubelet'}. It starts anew
    when its template, its config, its pod or the kubelet's socket changed since, or while it crash-loops. It
    loads NVML once, at start: without it (FAIL_ON_INIT_ERROR=false, as gpuk8s deploys it) it logs "No devices
    found. Waiting indefinitely." and stays so until its pod restarts, whatever is repaired meanwhile."""
    d = _host_dir(n["host"]) / DEVICE_PLUGINS
    mark = _host_dir(n["host"]) / "var_lib/gpuk8s-lab/plugin-started"
    plugin = _device_plugin(s)
    try:
        st = (d / "kubelet.sock").stat()
        kubelet: list[int] | None = [st.st_ino, st.st_mtime_ns]
    except OSError:
        kubelet = None
    if plugin is None or not _runs_on(plugin, _node_labels(name, n)) or _ds_pull(s, plugin, n):
        if mark.exists():  # the plugin stopped: it removed its sockets
            for old in d.glob("nvidia-*.sock"):
                with contextlib.suppress(OSError):
                    old.unlink()
            mark.unlink()
        return {"nvml": False, "sockets": True, "kubelet": kubelet is not None, "current": True}
    p = _plugin_on_node(s, name, n)
    pod = f"{plugin['metadata']['name']}-{name}"
    # the plugin's watcher sees kubelet.sock made anew and starts again; a test's fault makes it miss that
    # (the race of bottlerocket-os/bottlerocket issue 4250): it then stays registered with a kubelet that is gone
    missed = bool(_read_json(_hp(n["host"], "var_lib/gpuk8s-lab/state.json"))
                  .get("plugin_misses_kubelet_restart"))
    key = hashlib.sha1(json.dumps([_pod_spec(plugin), p.get("config"), s.get("pod_restarts", {}).get(pod, 0)],
                                  sort_keys=True, default=str).encode()).hexdigest()
    try:
        m = json.loads(mark.read_text())
    except (OSError, ValueError):
        m = {}
    anew = m.get("key") != key or (m.get("registered_with") != kubelet and not missed)
    if anew or p.get("error"):  # a crash-looping plugin starts again and again
        if anew:
            for old in d.glob("nvidia-*.sock"):  # the old pod's plugin removed its sockets when it stopped
                with contextlib.suppress(OSError):
                    old.unlink()
            m = {"key": key, "sockets": False, "registered_with": kubelet}
        m["nvml"] = _node_gpus(s, n) > 0
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(json.dumps(m))
    return {**m, "kubelet": kubelet is not None, "current": m.get("registered_with") == kubelet}


def _plugin_gpus(s: dict[str, Any], name: str, n: dict[str, Any]) -> int:
    """The GPUs the running plugin sees: none when it started without NVML."""
    return _memo(("plugin-gpus", id(s), name),  # type: ignore[no-any-return]
                 lambda: _node_gpus(s, n) if _plugin_start(s, name, n).get("nvml") else 0)


def _registered(s: dict[str, Any], name: str, n: dict[str, Any], serving: list[str]) -> set[str]:
    """The resources of `serving` whose plugin socket the node's kubelet can reach; the plugin makes its sockets
    the first time it serves after it started."""
    d = _host_dir(n["host"]) / DEVICE_PLUGINS
    m = _plugin_start(s, name, n)
    if not m["kubelet"]:
        return set()  # no kubelet serving registrations: "Could not register device plugin"
    if not m["current"]:
        return set()  # registered with the kubelet before its restart: this one does not know the plugin
    if serving and not m.get("sockets"):
        for res in serving:
            _mksock(d / plugin_socket(res))
        mark = _host_dir(n["host"]) / "var_lib/gpuk8s-lab/plugin-started"
        kept = {k: v for k, v in m.items() if k not in ("kubelet", "current")}
        mark.write_text(json.dumps({**kept, "sockets": True}))
    # the kubelet keeps its stream to a registered plugin: a socket file removed later does not end it
    return set(serving)


def node_json(s: dict[str, Any], name: str) -> dict[str, Any]:
    """The Node object as the fakes reason about it (kubectl serves _served_node of it); once per call per node
    (the caller must not change it)."""
    return _memo(("node", id(s), name), lambda: _node_now(s, name))  # type: ignore[no-any-return]


def _node_now(s: dict[str, Any], name: str) -> dict[str, Any]:
    n = s["nodes"][name]
    capacity = {"cpu": "16", "memory": "65536Mi", "pods": "110"}
    gpus = _plugin_gpus(s, name, n)
    serving: list[str] = []  # what the NVIDIA plugin serves on this node
    if _device_plugin(s) is not None and _gpus_on(n["host"]):
        p = _plugin_on_node(s, name, n)
        if p["runs"] and p.get("mig", "none") != "none" and gpus and not p["error"]:
            mig = _mig_capacity(n["host"], p)
            capacity.update(mig)
            serving = sorted(mig)
        elif p["runs"]:
            capacity[p["resource"]] = "0" if p["error"] else str(gpus * p["replicas"])
            serving = [p["resource"]] if gpus and not p["error"] else []
    registered = _registered(s, name, n, serving)
    annotations: dict[str, str] = {}
    if _hami_on(s, name, n) and _gpus_on(n["host"]):  # HAMi's plugin registers GPUs x deviceSplitCount
        capacity["nvidia.com/gpu"] = str(_gpus_on(n["host"]) * _hami_split(s))
        # as HAMi's Go structs marshal it: omitempty leaves out a zero index or numa and a false health
        annotations["hami.io/node-nvidia-register"] = json.dumps(
            [{k: v for k, v in d.items() if v not in (0, False, "")} for d in _hami_devices(s, n)])
    capacity.update(rdma_capacity(s, name, n))  # the RDMA shared device plugin's resource (issue 43)
    allocatable = {k: ("0" if k in serving and k not in registered else v) for k, v in capacity.items()}
    sick = len(_xid_sick(n["host"])) if serving and "nvidia.com/gpu" in serving else 0
    if sick:  # whole GPUs only: the lab's health faults are on unshared, non-MIG nodes
        allocatable["nvidia.com/gpu"] = str(max(0, int(allocatable["nvidia.com/gpu"]) - sick))
    # the CNI's pod on this node (and kube-proxy's) must pull its images: else no network plugin there
    ready = _cni_ready(s) and not any(_ds_pull(s, ds, n) for ds in _daemonsets(s)
                                      if re.search(r"calico-node|flannel", ds["metadata"]["name"]))
    ready = ready and not (s.get("kube_proxy_image") and pull_error(n["host"], s["kube_proxy_image"]))
    down = bool(n.get("down"))  # a test's powered-off host: its kubelet stopped posting status
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **n.get("labels", {})},
                     **({"annotations": annotations} if annotations else {})},
        "spec": {**({"taints": n["taints"]} if n.get("taints") else {}),
                 **({"unschedulable": True} if n.get("unschedulable") else {})},
        "status": {
            "capacity": capacity, "allocatable": allocatable,
            # a node that stopped posting: the node lifecycle controller's Unknown (node_lifecycle_controller.go)
            "conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                            "message": "Kubelet stopped posting node status."}] if down else
                           [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "KubeletReady" if ready else "KubeletNotReady",
                            "message": "kubelet is posting ready status" if ready else
                            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                            "message:Network plugin returns error: cni plugin not initialized"}],
            "nodeInfo": {"kubeletVersion": _kubelet_version(n["host"]) or s.get("version", "v1.30.0")},
        },
    }


def _pods(s: dict[str, Any], ns: str | None = None, name: str | None = None,
          node: str | None = None) -> list[dict[str, Any]]:
    """The pods the API server serves: the DaemonSets' (one per node they place) and the stored ones with their
    statuses; only those in namespace `ns`, named `name`, on node `node` where given (a DaemonSet's pods of other
    nodes, namespaces or names are not made at all)."""
    pods = []
    for ds in _daemonsets(s):
        md = ds["metadata"]
        if ns is not None and md.get("namespace", "default") != ns:
            continue
        prefix = f"{md['name']}-"
        if name is not None and not name.startswith(prefix):
            continue
        for nname, n in s.get("nodes", {}).items():
            if (node is not None and nname != node) or (name is not None and name != prefix + nname):
                continue
            pod = _ds_pod(s, ds, nname, n)
            if pod is not None:
                pods.append(pod)
    o = s.get("objects", {}).get(f"Pod/{ns}/{name}") if name is not None and ns is not None else None
    if o is not None and o.get("kind") == "Pod" and o.get("metadata", {}).get("namespace") == ns:
        stored = [o]
    else:  # (a stored pod without a namespace is served in every namespace asked for, as it always was here)
        stored = [o for o in _of_kind(s, "Pod") if (ns is None or o.get("metadata", {}).get("namespace", ns) == ns)
                  and (name is None or o.get("metadata", {}).get("name") == name)]
    for o in stored:
        pod = _stored_pod(s, o)
        if node is None or pod["spec"].get("nodeName") == node:
            pods.append(pod)
    return pods


def _ds_pod(s: dict[str, Any], ds: dict[str, Any], name: str, n: dict[str, Any]) -> dict[str, Any] | None:
    """The DaemonSet's pod on node `name`, None where it places none."""
    md = ds["metadata"]
    if not _runs_on(ds, _node_labels(name, n)) or not _ds_places(s, ds, name, n):
        return None
    status: dict[str, Any] = {"phase": "Running"}
    if ds is _device_plugin(s) and _gpus_on(n["host"]) and not _plugin_gpus(s, name, n):
        status = {"phase": "Running"}  # it runs, but registers no GPU (logs say NVML could not load)
    elif ds is _device_plugin(s) and _plugin_on_node(s, name, n).get("error"):
        error = _plugin_on_node(s, name, n)["error"]
        where = "initContainerStatuses" if "config" in error else "containerStatuses"
        status = {"phase": "Pending" if where == "initContainerStatuses" else "Running",
                  where: [{"name": "nvidia-device-plugin-init" if where == "initContainerStatuses"
                           else "nvidia-device-plugin-ctr", "restartCount": 4,
                           "state": {"waiting": {"reason": "CrashLoopBackOff", "message": error}}}]}
    pulled = _ds_pull(s, ds, n)
    tpl = _pod_spec(ds)
    if sandbox_refused(n["host"], tpl):
        status = creating(tpl)
    elif pulled:
        status = pull_backoff_status(pulled[0], name, tpl)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{md['name']}-{name}", "namespace": md.get("namespace", "default"),
                         "labels": ds.get("spec", {}).get("selector", {}).get("matchLabels", {}),
                         "ownerReferences": [{"kind": "DaemonSet", "name": md["name"]}]},
            "spec": {**{k: tpl[k] for k in ("containers", "initContainers", "runtimeClassName")
                        if k in tpl}, "nodeName": name},
            "status": _ds_pod_status(s, ds, n, "Running") if _is_exporter(ds) and not pulled else status}


def _stored_pod(s: dict[str, Any], o: dict[str, Any]) -> dict[str, Any]:
    """A stored pod with its status: where the scheduler put it, what its node's kubelet made of it."""
    st = _pod_status(s, o)
    md = o.get("metadata", {})
    if st.get("hami"):  # hami-scheduler's placement: an annotation on the pod, not a status field
        md = {**md, "annotations": {**(md.get("annotations") or {}),
                                    "hami.io/vgpu-devices-allocated": _hami_allocated(st["hami"])}}
        st = {k: v for k, v in st.items() if k != "hami"}
    where = st.get("hostIP")
    if where in s.get("nodes", {}) and st.get("phase") in ("Running", "Succeeded"):
        pulled = pod_pull_error(s["nodes"][where]["host"], o.get("spec", {}))
        if pulled:
            st = {**pull_backoff_status(pulled[0], where), **({"bound": True} if st.get("bound") else {})}
    if st.get("bound"):  # the scheduler binds it: spec.nodeName is set
        return {**o, "metadata": md, "spec": {**o.get("spec", {}), "nodeName": st["hostIP"]}, "status": st}
    return {**o, "metadata": md, "status": st}


_EXTENDED = ("nvidia.com/", "hami.io/")


def _requests(pod: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in pod.get("spec", {}).get("containers", []):
        for k, v in (c.get("resources", {}).get("limits", {}) or {}).items():
            if k.startswith(_EXTENDED):
                out[k] = out.get(k, 0) + int(v)
    return out


def _accounted(pod: dict[str, Any]) -> bool:
    """Whether this pod's status and the pods' after it can depend on the pods before it: it asks for extended
    resources (GPUs, HAMi's: the scheduler and the kubelet count what the pods before it hold), or hami-scheduler
    places it on a GPU by what the pods before it hold. Another pod's status depends on no other pod (its verdict
    needs no tally) and no pod's on it, so it is computed alone, when asked for."""
    return (bool(_requests(pod)) or bool(_ext_requests(pod)) or bool(pod.get("spec", {}).get("resourceClaims"))
            or pod.get("spec", {}).get("schedulerName") == "hami-scheduler")


class _Placement:
    """The stored pods' statuses, as the scheduler and the kubelets account for them: the pods that hold
    something (_accounted) in one pass in creation order, each seeing what the pods created before it hold on
    each node (bound and not finished: their extended resources, HAMi's MiB per GPU); the others alone. Once per
    call; a status is computed when first asked for (a get of one pod places only the accounted pods before it)."""

    def __init__(self, s: dict[str, Any]) -> None:
        self.s = s
        self.pods = [p for p in _of_kind(s, "Pod") if _accounted(p)]
        self.at = {id(p): i for i, p in enumerate(self.pods)}
        self.done: list[dict[str, Any]] = []  # the statuses of self.pods[:len(self.done)]
        self.alone: dict[int, dict[str, Any]] = {}  # the statuses of the other pods, by id
        self.used: dict[str, dict[str, int]] = {}  # node -> resource -> held by the pods placed so far
        self.held: dict[str, dict[str, int]] = {}  # node -> GPU UUID -> MiB hami-scheduler gave them
        self.dra: dict[str, set[str]] = {}  # node -> the DRA devices the pods placed so far hold

    def status(self, pod: dict[str, Any]) -> dict[str, Any]:
        i = self.at.get(id(pod))
        if i is not None:
            self.advance(i + 1)
            return self.done[i]
        if _accounted(pod):  # not a stored pod (none asks today): it comes after every stored one
            self.advance(len(self.pods))
            return _pod_status_now(self.s, pod)
        if id(pod) not in self.alone:
            self.alone[id(pod)] = _pod_status_now(self.s, pod)
        return self.alone[id(pod)]

    def advance(self, upto: int) -> None:
        while len(self.done) < upto:
            o = self.pods[len(self.done)]
            st = _pod_status_now(self.s, o)
            self.done.append(st)
            node = st.get("hostIP")
            if node and st.get("phase") in ("Running", "Pending") and st.get("bound"):
                used = self.used.setdefault(node, {})
                for k, v in _requests(o).items():
                    used[k] = used.get(k, 0) + v
                held = self.held.setdefault(node, {})
                for uuid, mem, _cores in st.get("hami", []):
                    held[uuid] = held.get(uuid, 0) + mem
                self.dra.setdefault(node, set()).update(d for _c, _r, d in st.get("dra", []))


def _placement(s: dict[str, Any]) -> _Placement:
    return _memo(("placement", id(s)), lambda: _Placement(s))  # type: ignore[no-any-return]


def _used_before(s: dict[str, Any], pod: dict[str, Any], node: str) -> dict[str, int]:
    """What the pods created before this one hold on the node: those bound and not finished (asked while the
    placement pass is at this pod)."""
    return dict(_placement(s).used.get(node, {}))


def _hami_held_before(s: dict[str, Any], pod: dict[str, Any], node: str) -> dict[str, int]:
    """MiB of each GPU (by UUID) hami-scheduler gave the pods created before this one on the node."""
    return dict(_placement(s).held.get(node, {}))


def _hami_allocated(devices: list[list[Any]]) -> str:
    """hami.io/vgpu-devices-allocated of a one-container pod: `UUID,TYPE,MEMORY,CORES:` per device, then `;`."""
    return "".join(f"{uuid},NVIDIA,{mem},{cores}:" for uuid, mem, cores in devices) + ";"


def _runs_forever(pod: dict[str, Any]) -> bool:
    """A pod whose containers do not end: one that sleeps (the sharing proof), or one whose spec says
    restartPolicy Always (a server's pod, as a Deployment's: restarted whenever it ends, never Succeeded)."""
    spec = pod.get("spec", {})
    return spec.get("restartPolicy") == "Always" or any(c.get("command", [])[:1] == ["sleep"]
                                                        for c in spec.get("containers", []))


def _pod_status(s: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """A stored pod's status (the caller must not change it): from the call's placement pass."""
    return _placement(s).status(pod)


def _pod_status_now(s: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """A GPU test pod runs to completion only on a Ready node with enough allocatable nvidia.com/gpu."""
    running = _lab_running(s, pod)
    if running is not None:
        return running
    fabric = fabric_pod_status(s, pod)  # nccl-tests and perftest pods (verify --fabric)
    if fabric is not None:
        return fabric
    placed = _schedule(s, pod)  # a pod not pinned to a node: the scheduler's filters (gpuk8s doctor, issue 19)
    if placed is not None:
        return placed
    spec = pod.get("spec", {})
    node = _pinned_node(pod)
    want = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
               for c in spec.get("containers", []))
    if node not in s.get("nodes", {}):
        return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": f"0/{len(s.get('nodes', {}))} nodes are available: 1 node(s) "
                "didn't match Pod's node affinity/selector."}]}
    n = node_json(s, node)
    if sandbox_refused(s["nodes"][node]["host"], spec):  # the kubelet cannot make its sandbox: ContainerCreating
        return {**creating(spec), "hostIP": node}
    have = int(n["status"]["allocatable"].get("nvidia.com/gpu", 0))
    wants = _requests(pod)
    if set(wants) - {"nvidia.com/gpu"} or _runs_forever(pod) or spec.get("schedulerName"):
        return _shared_pod_status(s, pod, node, n, wants)
    if spec.get("nodeName") and have < want:  # bound without the scheduler: the kubelet's admission rejects it
        return {"phase": "Failed", "reason": "OutOfnvidia.com/gpu", "message": "Pod was rejected: Node didn't have "
                f"enough resource: nvidia.com/gpu, requested: {want}, used: 0, capacity: {have}"}
    if n["status"]["conditions"][0]["status"] != "True" or have < want:
        why = "Insufficient nvidia.com/gpu" if have < want else _taint_reason(s, "node.kubernetes.io/not-ready", "")
        return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": f"0/{len(s['nodes'])} nodes are available: 1 {why}."}]}
    return {"phase": "Succeeded", "hostIP": node}


def _shared_pod_status(s: dict[str, Any], pod: dict[str, Any], node: str, n: dict[str, Any],
                       wants: dict[str, int]) -> dict[str, Any]:
    """A pod of the sharing proof (it sleeps, holding its slice) or asking for HAMi's or renamed resources: the
    scheduler counts what the pods before it hold; the kubelet asks the plugin to Allocate, which may refuse."""
    spec = pod.get("spec", {})
    alloc = n["status"]["allocatable"]
    if spec.get("schedulerName") == "hami-scheduler":
        if not _named(s, "Deployment", "hami-scheduler"):
            return {"phase": "Pending"}  # no scheduler of that name: nobody binds it, no event either
        if not _hami_on(s, node, s["nodes"][node]):
            return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                    "reason": "Unschedulable", "message": f"0/{len(s['nodes'])} nodes are available: 1 "
                    "NodeUnfitPod."}]}
        mem, cores = wants.get("nvidia.com/gpumem", 0), wants.get("nvidia.com/gpucores", 0)
        held = _hami_held_before(s, pod, node)
        # spread, HAMi's default GPU policy: the least-used devices the pod's memory fits on, the lowest index on a
        # tie; each of its nvidia.com/gpu on another device (the lab checks memory only, not cores or pod counts)
        fits = sorted((d for d in _hami_devices(s, s["nodes"][node]) if held.get(d["id"], 0) + mem <= d["devmem"]),
                      key=lambda d: (held.get(d["id"], 0), d["index"]))
        if len(fits) < max(wants.get("nvidia.com/gpu", 1), 1):
            return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                    "reason": "Unschedulable", "message": f"0/{len(s['nodes'])} nodes are available: 1 "
                    "CardInsufficientMemory."}]}
        return {"phase": "Running" if _runs_forever(pod) else "Succeeded", "hostIP": node, "bound": True,
                "hami": [[d["id"], mem, cores] for d in fits[:max(wants.get("nvidia.com/gpu", 1), 1)]]}
    used = _used_before(s, pod, node)
    short = sorted(k for k, v in wants.items() if k.startswith(("nvidia.com/gpu", "nvidia.com/mig-"))
                   and int(alloc.get(k, 0)) - used.get(k, 0) < v)
    if n["status"]["conditions"][0]["status"] != "True" or short:
        not_ready = _taint_reason(s, "node.kubernetes.io/not-ready", "")
        why = ", ".join(f"1 Insufficient {k}" for k in short) or "1 " + not_ready
        return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": f"0/{len(s['nodes'])} nodes are available: {why}."}]}
    p = _plugin_on_node(s, node, s["nodes"][node])
    big = next((k for k in (p.get("resource"), *p.get("names", [])) if k and wants.get(k, 0) > 1), None)
    if p.get("runs") and p.get("fail_gt1") and big:
        # kubelet pkg/kubelet/cm/admission/errors.go wraps the plugin's Allocate error (internal/rm/rm.go)
        return {"phase": "Failed", "reason": "UnexpectedAdmissionError", "hostIP": node,
                "message": "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = invalid request: "
                f"maximum request size for shared resources is 1; found {wants[big]}, which is unexpected"}
    return {"phase": "Running" if _runs_forever(pod) else "Succeeded", "hostIP": node, "bound": True}


def _key(o: dict[str, Any]) -> str:
    md = o.get("metadata", {})
    namespaced = o.get("kind") not in ("RuntimeClass", "Namespace", "ClusterRole", "ClusterRoleBinding", "Node",
                                       "DeviceClass", "ResourceSlice", "ValidatingAdmissionPolicy",
                                       "ValidatingAdmissionPolicyBinding")
    return f"{o.get('kind')}/{md.get('namespace', 'default') if namespaced else ''}/{md.get('name')}"


# kubectl's flags that take a value as the next word (so that the value is not taken for a word of the command)
_VALUE_FLAGS = ("-o", "-n", "-f", "-l", "-c", "--namespace", "--kubeconfig", "--output", "--context", "--selector",
                "--field-selector", "--chunk-size", "--request-timeout", "--container", "--sort-by", "--template",
                "--since", "--label-columns", "-L")


def _words(args: list[str]) -> list[str]:
    return [a for i, a in enumerate(args) if not a.startswith("-") and not (i and args[i - 1] in _VALUE_FLAGS)]


def _output(args: list[str]) -> str:
    """-o/--output's value (-o json, -o=json, -ojson, --output json)."""
    given = _flag(args, "-o") or _flag(args, "--output")
    if given:
        return given
    return next((a[2:] for a in args if a.startswith("-o") and not a.startswith("--") and len(a) > 2), "")


def _namespace(args: list[str]) -> str | None:
    return _flag(args, "-n") or _flag(args, "--namespace")


def kubectl(h: Any, args: list[str]) -> int:
    new_call()
    if args[:1] == ["version"]:
        out("Client Version: v" + h.state.get("packages", {}).get("kubectl", "1.30.0-1.1").split("-")[0] + "\n")
        return 0
    missing = _missing_context(args)
    if missing:
        # client-go tools/clientcmd/validation.go (errContextNotFound), as kubectl prints it
        err(f"Error in configuration: context was not found for specified context: {missing}\n")
        return 1
    server = _server_from_kubeconfig(args)
    if server is None:
        err("E1129 memcache.go:265] couldn't get current server API group list: Get \"http://localhost:8080/api\": "
            "dial tcp 127.0.0.1:8080: connect: connection refused\nThe connection to the server localhost:8080 was "
            "refused - did you specify the right host or port?\n")
        return 1
    host, _, port = server.rpartition(":")
    try:
        # client-go dials with a 30 s timeout (net.Dialer{Timeout: 30 * time.Second}): a loaded machine's slow
        # answer is waited for, as kubectl waits; only a refused connection or that timeout fails
        socket.create_connection((host, int(port)), timeout=30).close()
    except TimeoutError:
        err(f"Unable to connect to the server: dial tcp {host.split('//')[-1]}:{port}: i/o timeout\n")
        return 1
    except OSError:
        err(f"The connection to the server {server} was refused - did you specify the right host or port?\n")
        return 1
    words = _words(args)
    verb = words[0] if words else ""
    if verb == "apply":
        return _apply(_flag(args, "-f") or "-")
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
    handled = _monitoring_kubectl(verb, words, args)
    if handled is not None:
        return handled
    handled = _doctor_kubectl(verb, words, args)
    if handled is not None:
        return handled
    if verb == "logs" and len(words) >= 2:
        s = read_state()
        pod = next(iter(_pods(s, name=words[1])), None)
        if pod is None or pod["status"].get("phase") != "Succeeded":
            err(f"Error from server (BadRequest): container in pod \"{words[1]}\" is waiting to start\n")
            return 1
        node = pod["status"]["hostIP"]
        host = s["nodes"][node]["host"]
        p = _plugin_on_node(s, node, s["nodes"][node])
        if p.get("mig", "none") != "none":
            # inside a container given one MIG device, nvidia-smi -L lists its parent GPU and that device only
            # (the MIG user guide's "Running CUDA Applications as Containers" example)
            want = next(iter(_requests(pod)), "nvidia.com/gpu")
            for i, d in _mig_devices(host).items():
                hit = next((x for x in d or [] if want in ("nvidia.com/gpu", "nvidia.com/mig-" + x.replace("+", "."))),
                           None)
                if hit:
                    out(f"GPU {i}: NVIDIA (UUID: GPU-{host}-{i:04d}-lab)\n"
                        f"  MIG {hit:<12}Device  0: (UUID: MIG-{host}-{i:04d}-01-lab)\n")
                    return 0
        for i in range(_gpus_on(host)):
            out(f"GPU {i}: NVIDIA (UUID: GPU-{host}-{i:04d}-lab)\n")
        return 0
    if verb in ("drain", "cordon", "uncordon") or (verb == "delete" and words[1:2] in (["node"], ["nodes"])):
        return _node_verb(verb, words, args)
    if verb == "delete" and len(words) >= 3:
        return _delete(words, _namespace(args) or "default")
    if verb == "get" and len(words) >= 2:
        return _get(words, args)
    err(f"kubectl {verb}: not simulated in the lab\n")
    return 1


def _apply(src: str) -> int:
    """kubectl apply -f FILE|-: YAML or JSON documents, a List's items each; stored in one write of the state.
    The API server gives a new object its uid, creationTimestamp and resourceVersion (kept when it is applied
    again)."""
    text = sys.stdin.read() if src == "-" else Path(src).read_text()
    try:  # JSON first: a large List of pods parses ~50x faster than as YAML
        docs: list[Any] = [json.loads(text)]
    except ValueError:
        docs = _yaml_docs(text)
    objs = [i for d in docs if isinstance(d, dict)
            for i in (d.get("items") or [] if d.get("kind") == "List" else [d]) if isinstance(i, dict)]
    lines = []
    with cluster_state() as s:
        objects = s.setdefault("objects", {})
        version = int(s.get("resource_version", 1000))
        for d in objs:
            k = _key(d)
            old = objects.get(k)
            version += 1
            md = d.setdefault("metadata", {})
            if d.get("kind") == "Pod":
                before = (old or {}).get("metadata", {})
                md.setdefault("uid", before.get("uid") or str(uuid.uuid4()))
                md.setdefault("creationTimestamp", before.get("creationTimestamp") or _now())
                md["resourceVersion"] = str(version)
            objects[k] = d
            lines.append(f"{d['kind'].lower()}/{md['name']} {'configured' if old is not None else 'created'}\n")
        s["resource_version"] = version
    out("".join(lines))
    return 0


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _delete(words: list[str], ns: str) -> int:
    """kubectl delete KIND NAME... -n NS: each name found once (an index of the stored objects, not a scan of them
    per name); a DaemonSet's pod restarts (its controller makes it anew)."""
    kind = {"pod": "Pod", "pods": "Pod", "po": "Pod"}.get(words[1], words[1])
    lines = []
    with cluster_state() as s:
        objects = s.get("objects", {})
        by_name: dict[tuple[str, str], list[str]] | None = None
        ds_pods: set[str] | None = None
        for name in words[2:]:
            gone = objects.pop(f"{kind}/{ns}/{name}", None) is not None
            if not gone:
                if by_name is None:  # kubectl delete KIND NAME for any stored kind (the lower-case kind, a plural)
                    by_name = {}
                    for key in objects:
                        k, kns, kname = key.split("/", 2)
                        if kns in (ns, ""):
                            by_name.setdefault((k.lower(), kname), []).append(key)
                keys = by_name.get((kind.lower(), name)) or by_name.get((kind.lower().removesuffix("s"), name)) or []
                key = next((x for x in keys if x in objects), None)
                if key is not None:
                    del objects[key]
                    gone = True
            if gone:
                lines.append(f"{words[1]} \"{name}\" deleted\n")
            elif kind == "Pod":
                if ds_pods is None:  # the DaemonSets' pods in this namespace, by name (no status needed)
                    ds_pods = {f"{ds['metadata']['name']}-{n}" for ds in _daemonsets(s)
                               if ds["metadata"].get("namespace", "default") == ns
                               for n, node in s.get("nodes", {}).items()
                               if _runs_on(ds, _node_labels(n, node)) and _ds_places(s, ds, n, node)}
                if name in ds_pods:
                    # a DaemonSet's pod: its controller makes a new one at once, whose containers start afresh
                    restarts = s.setdefault("pod_restarts", {})
                    restarts[name] = restarts.get(name, 0) + 1
                    lines.append(f"{words[1]} \"{name}\" deleted\n")
    out("".join(lines))
    return 0


# The fields the API server selects on (--field-selector), per resource (pkg/registry/core/*/strategy.go
# ToSelectableFields); another is refused as kubernetes/kubernetes issue 80010 quotes it: 'Error from server
# (BadRequest): Unable to find "nodes" that match label selector "", field selector "spec.Unschedulable=true": field
# label not supported: spec.Unschedulable'.
_FIELDS = {
    "pods": ("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
             "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs",
             "status.nominatedNodeName"),
    "nodes": ("metadata.name", "spec.unschedulable"),
    "events": ("metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
               "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
               "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent", "source",
               "type"),
}
_KINDS = {"nodes": ("nodes", "node", "no"), "pods": ("pods", "pod", "po"),
          "daemonsets": ("daemonsets", "daemonset", "ds"), "events": ("events", "event", "ev"),
          "resourceslices": ("resourceslices", "resourceslice"), "resourceclaims": ("resourceclaims", "resourceclaim")}


def _field(obj: dict[str, Any], path: str) -> str:
    v: Any = obj
    for part in path.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    if path == "source" and isinstance(v, dict):
        v = v.get("component")
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


def _field_selector(text: str) -> list[tuple[str, bool, str]]:
    """(field, equal?, value) of each term of a --field-selector (a=b, a==b, a!=b, comma-separated)."""
    terms = []
    for t in filter(None, text.split(",")):
        m = re.fullmatch(r"\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*", t)
        if m:
            terms.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return terms


def _label_selector(text: str) -> list[tuple[str, str, list[str]]]:
    """(key, operator, values) of each requirement of a -l selector: k=v, k==v, k!=v, k, !k, k in (a,b),
    k notin (a,b)."""
    out_: list[tuple[str, str, list[str]]] = []
    for m in re.finditer(r"\s*(!?)([\w./-]+)\s*(?:(==|=|!=)\s*([\w./-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*(?:,|$)",
                         text):
        neg, key, op, value, setop, values = m.groups()
        if setop:
            out_.append((key, setop, [v.strip() for v in values.split(",") if v.strip()]))
        elif op:
            out_.append((key, "!=" if op == "!=" else "=", [value or ""]))
        else:
            out_.append((key, "!" if neg else "exists", []))
    return out_


def _labels_match(obj: dict[str, Any], reqs: list[tuple[str, str, list[str]]]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for key, op, values in reqs:
        have = labels.get(key)
        ok = {"=": have == values[0] if values else False, "!=": have != values[0] if values else True,
              "exists": key in labels, "!": key not in labels, "in": have in values,
              "notin": have not in values}[op]
        if not ok:
            return False
    return True


def _get(words: list[str], args: list[str]) -> int:
    """kubectl get KIND [NAME] [-n NS|-A] [-l SEL] [--field-selector SEL] [--chunk-size N] [-o FORMAT]: what is
    asked for is made (one node, one node's pods, one namespace's), then served in the real objects' shape."""
    if "/" in words[1]:
        return _get_refs(words[1:], args)
    s = read_state()
    kind = words[1].split(".")[0]
    resource = next((r for r, names in _KINDS.items() if kind in names), kind)
    ns = _namespace(args)
    everywhere = "-A" in args or "--all-namespaces" in args
    ns = None if everywhere else ns
    name = words[2] if len(words) >= 3 else None
    fsel = _field_selector(_flag(args, "--field-selector") or "")
    bad = next((f for f, _, _ in fsel if f not in _FIELDS.get(resource, ("metadata.name", "metadata.namespace"))),
               None)
    if bad:
        err(f"Error from server (BadRequest): Unable to find \"{resource}\" that match label selector "
            f"\"{_flag(args, '-l') or _flag(args, '--selector') or ''}\", field selector "
            f"\"{_flag(args, '--field-selector')}\": field label not supported: {bad}\n")
        return 1
    want = {f: v for f, eq, v in fsel if eq}  # what narrows what is made (a node, a namespace, a name)
    items: list[dict[str, Any]]
    if resource == "nodes":
        wanted = name or want.get("metadata.name")
        names = [wanted] if wanted is not None else list(s.get("nodes", {}))
        items = [_served_node(s, n) for n in names if n in s.get("nodes", {})]
    elif resource == "pods":
        items = [_served_pod(s, p) for p in _pods(s, ns=ns or want.get("metadata.namespace"),
                                                   name=name or want.get("metadata.name"),
                                                   node=want.get("spec.nodeName"))]
    elif resource == "daemonsets":
        items = []
        for ds in _daemonsets(s):
            n = len(s.get("nodes", {}))
            items.append({**ds, "status": {"desiredNumberScheduled": n, "numberReady": n, "numberAvailable": n}})
    elif resource == "events":
        items = _events(s)
    elif resource == "resourceslices":
        items = _dra_slices(s)
    elif resource == "resourceclaims":
        items = _dra_claims(s, ns)
    else:
        items = [o for o in s.get("objects", {}).values()  # the kind, or its plural (deviceclasses)
                 if o.get("kind", "").lower() in (kind, kind.removesuffix("s"), kind.removesuffix("es"))]
    if ns:
        items = [o for o in items if o["metadata"].get("namespace", ns) == ns]
    if fsel:
        items = [o for o in items if all((_field(o, f) == v) == eq for f, eq, v in fsel)]
    labels = _flag(args, "-l") or _flag(args, "--selector")
    if labels:
        reqs = _label_selector(labels)
        items = [o for o in items if _labels_match(o, reqs)]
    if name is not None:
        items = [o for o in items if o["metadata"]["name"] == name]
        if not items:
            err(f"Error from server (NotFound): {kind} \"{name}\" not found\n")
            return 1
    output = _output(args)
    doc: Any = items[0] if name is not None else {"apiVersion": "v1", "items": items, "kind": "List",
                                                  "metadata": {"resourceVersion": ""}}
    if output == "json":
        out(_kubectl_json(doc) + "\n")
    elif output == "yaml":
        out(yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), default_flow_style=False))
    elif output == "name":
        out("".join(f"{_singular(o)}/{o['metadata']['name']}\n" for o in items))
    elif output.startswith("jsonpath="):
        text = _jsonpath(doc, output.split("=", 1)[1])
        if text is None:
            return 1
        out(text)
    elif output.startswith("custom-columns="):
        out(_custom_columns(items, output.split("=", 1)[1], "--no-headers" in args))
    else:
        out("".join(o["metadata"]["name"] + "\n" for o in items))
    return 0


def _get_refs(refs: list[str], args: list[str]) -> int:
    """kubectl get KIND/NAME... [-n NS] [--ignore-not-found] -o json, as kubectl does it: one name prints the object
    itself, more a List of those found; one missing is an error (the others still printed) unless
    --ignore-not-found, and none found with it prints nothing. The objects gpuk8s applies and the DaemonSets only
    (nodes, pods and events are not read this way)."""
    s = read_state()
    ns = _namespace(args) or "default"
    found, rc = [], 0
    for ref in refs:
        kind, _, name = ref.partition("/")
        kind = kind.split(".")[0]
        resource = next((r for r, names in _KINDS.items() if kind in names), kind)
        if resource in ("nodes", "pods", "events"):
            err(f"lab: kubectl get {ref}: not modelled (gpuk8s reads these by kind)\n")
            return 1
        pool = _daemonsets(s) if resource == "daemonsets" else [
            o for o in s.get("objects", {}).values() if o.get("kind", "").lower() in (kind, kind.rstrip("s"))]
        hit = [o for o in pool if o["metadata"]["name"] == name and o["metadata"].get("namespace", ns) == ns]
        if hit:
            n = len(s.get("nodes", {}))
            found.append({**hit[0], "status": {"desiredNumberScheduled": n, "numberReady": n, "numberAvailable": n}}
                         if resource == "daemonsets" else hit[0])
        elif "--ignore-not-found" not in args:
            err(f"Error from server (NotFound): {kind} \"{name}\" not found\n")
            rc = 1
    if _output(args) != "json":
        err("lab: kubectl get KIND/NAME... is modelled with -o json only\n")
        return 1
    if found:
        doc = found[0] if len(refs) == 1 else {"apiVersion": "v1", "items": found, "kind": "List",
                                                "metadata": {"resourceVersion": ""}}
        out(_kubectl_json(doc) + "\n")
    return rc


def _kubectl_json(doc: Any) -> str:
    """json.dumps(doc, indent=4, sort_keys=True), as kubectl prints JSON (4-space indent, keys sorted: the
    objects go through a map), byte for byte, in a third of the time: json's indenting encoder is pure Python and
    passes every token up a chain of generators as deep as the document (3 s for 5,000 pods of 20 KB)."""
    parts: list[str] = []
    put = parts.append

    def dump(o: Any, indent: str) -> None:
        if isinstance(o, str):
            put(_encode_str(o))
        elif isinstance(o, dict):
            if not o:
                put("{}")
                return
            inner = indent + "    "
            sep = ",\n" + inner
            put("{\n" + inner)
            first = True
            for k in sorted(o):
                if not first:
                    put(sep)
                first = False
                put(_encode_str(k))
                put(": ")
                dump(o[k], inner)
            put("\n" + indent + "}")
        elif isinstance(o, list | tuple):
            if not o:
                put("[]")
                return
            inner = indent + "    "
            sep = ",\n" + inner
            put("[\n" + inner)
            first = True
            for v in o:
                if not first:
                    put(sep)
                first = False
                dump(v, inner)
            put("\n" + indent + "]")
        elif o is None:
            put("null")
        elif o is True:
            put("true")
        elif o is False:
            put("false")
        else:  # int, float
            put(json.dumps(o))

    dump(doc, "")
    return "".join(parts)


def _singular(o: dict[str, Any]) -> str:
    kind = str(o.get("kind", "")).lower()
    group = str(o.get("apiVersion", "v1")).rpartition("/")[0]
    return f"{kind}.{group}" if group else kind


# -- kubectl -o jsonpath / custom-columns (k8s.io/client-go/util/jsonpath): the subset a script uses -------------
# {.a.b}, {.a['b.c']}, {.a.b\.c}, {.items[*].x}, {.items[0]}, {.items[?(@.type=="Ready")].status}, {range X}...{end},
# {"\t"} literals. A value prints as text (strings as they are, other values as JSON), several values separated
# by a space, as kubectl prints them.
def _jp_steps(path: str) -> list[tuple[str, str]]:
    steps: list[tuple[str, str]] = []
    i = 0
    path = path.strip()
    if path.startswith("$"):
        path = path[1:]
    while i < len(path):
        c = path[i]
        if c == ".":
            j = i + 1
            name = ""
            while j < len(path) and path[j] not in ".[":
                if path[j] == "\\" and j + 1 < len(path):
                    name += path[j + 1]
                    j += 2
                    continue
                name += path[j]
                j += 1
            if name:
                steps.append(("key", name))
            i = j
        elif c == "[":
            j = path.index("]", i) if not path.startswith("[?(", i) else path.index(")]", i) + 1
            inner = path[i + 1:j]
            if inner == "*":
                steps.append(("all", ""))
            elif inner.startswith("?("):
                steps.append(("filter", inner[2:-1]))
            elif inner[:1] in "'\"":
                steps.append(("key", inner[1:-1]))
            else:
                steps.append(("index", inner))
            i = j + 1
        else:
            raise ValueError(f"unexpected {c!r} in {path!r}")
    return steps


def _jp_eval(values: list[Any], path: str) -> list[Any]:
    for kind, arg in _jp_steps(path):
        nxt: list[Any] = []
        for v in values:
            if kind == "key" and isinstance(v, dict) and arg in v:
                nxt.append(v[arg])
            elif kind == "all":
                nxt.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else [])
            elif kind == "index" and isinstance(v, list):
                with contextlib.suppress(ValueError, IndexError):
                    nxt.append(v[int(arg)] if ":" not in arg else v[slice(*(int(x) if x else None
                                                                            for x in arg.split(":")))])
            elif kind == "filter" and isinstance(v, list):
                m = re.fullmatch(r"\s*@(\.[^=!<>]+?)\s*(==|!=)\s*(['\"]?)(.*?)\3\s*", arg)
                for item in v:
                    if m:
                        got = _jp_eval([item], m.group(1))
                        text = _jp_text(got[0]) if got else None
                        if (text == m.group(4)) == (m.group(2) == "=="):
                            nxt.append(item)
                    elif _jp_eval([item], "." + arg.strip().lstrip("@.")):
                        nxt.append(item)
        values = nxt
    return values


def _jp_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v, separators=(",", ":"))


def _jsonpath(doc: Any, template: str) -> str | None:
    """The text of a kubectl jsonpath template over doc (None, with kubectl's error, when it cannot parse it)."""
    tokens = re.findall(r"\{((?:[^{}\"]|\"(?:[^\"\\]|\\.)*\")*)\}|([^{}]+)", template)
    out_: list[str] = []
    try:
        def run(toks: list[tuple[str, str]], scope: Any) -> None:
            i = 0
            while i < len(toks):
                expr, literal = toks[i]
                expr = expr.strip()
                if literal:
                    out_.append(literal)
                elif expr.startswith("range "):
                    depth, j = 1, i + 1
                    while j < len(toks) and depth:
                        e = toks[j][0].strip()
                        depth += 1 if e.startswith("range ") else -1 if e == "end" else 0
                        j += 1
                    for item in _jp_eval([scope], expr[6:].strip()):
                        run(toks[i + 1:j - 1], item)
                    i = j
                    continue
                elif expr.startswith('"') and expr.endswith('"'):
                    out_.append(json.loads(expr))
                elif expr:
                    out_.append(" ".join(_jp_text(v) for v in _jp_eval([scope], expr if expr.startswith(("$", ".", "["))
                                                                        else "." + expr)))
                i += 1
        run(tokens, doc)
    except ValueError as e:
        err(f"error: error parsing jsonpath {template}, {e}\n")
        return None
    return "".join(out_)


def _custom_columns(items: list[dict[str, Any]], spec: str, no_headers: bool) -> str:
    cols = [c.split(":", 1) for c in spec.split(",") if ":" in c]
    rows = [[h for h, _ in cols]] if not no_headers else []
    for o in items:
        row = []
        for _, path in cols:
            got = _jp_eval([o], path if path.startswith((".", "[")) else "." + path)
            row.append(",".join(_jp_text(v) for v in got) if got else "<none>")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))] if rows else []
    return "".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows)


# -- served objects: the shape and the size of real ones (tests/fixtures/real/objects/SOURCE.md) -------------------
# What kubectl gets is what a real API server serves: a Node with the well-known labels, the kubelet's addresses,
# capacity and allocatable (ephemeral-storage, hugepages), pressure conditions, nodeInfo, runtimeHandlers and a GPU
# node's image list copied from a real node (50 images, ~12 KB); a Pod with the API server's defaults (the
# kube-api-access projected volume and its mounts, tolerations, policies) and the kubelet's status (conditions,
# containerStatuses, IPs, qosClass). The fakes reason on the small internal objects (node_json, _pods); only the
# output is dressed, so none of their decisions changes. Sizes: a lab GPU node as served ~29 KB, a lab pod like
# the minikube one ~6 KB (test_scale.py compares them with the real ones).
REAL = Path(__file__).resolve().parent / "real"  # tests/fixtures/real/objects, copied by lab.py at `up`
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _real(name: str) -> Any:
    """A real object of tests/fixtures/real/objects, parsed once (None where the lab has no copy)."""
    def load() -> Any:
        try:
            text = _read(REAL / name)
        except OSError:
            return None
        return json.loads(text) if name.endswith(".json") else _parse_cached(text, "yaml")
    return _memo(("real", name), load)


def _real_images(gpus: bool) -> list[dict[str, Any]]:
    """A real node's status.images: the A100 MIG node's 50 for a GPU node, the RKE2 node's 22 for another."""
    doc = _real("node-gpu-a100-mig.yaml" if gpus else "node-gpu-rke2-a16.json")
    if not isinstance(doc, dict):
        return []
    node = (doc.get("items") or [{}])[0] if doc.get("kind") == "List" else doc
    return list(node.get("status", {}).get("images") or [])


def _uid(*parts: str) -> str:
    """A stable UUID for what has no stored one (a node, a DaemonSet's pod): the same object, the same uid."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "lab/" + "/".join(parts)))


def _host_facts(host: str) -> dict[str, Any]:
    """What the node's kubelet reports of its host: address, arch, OS image, kernel, machine-id, runtime."""
    def facts() -> dict[str, Any]:
        spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
        try:
            state = _read_json(_hp(host, "var_lib/gpuk8s-lab/state.json"))
        except (OSError, ValueError):
            state = {}
        try:
            osr = dict(re.findall(r'^(\w+)="?(.*?)"?$', _read(_hp(host, "etc/os-release")), re.M))
        except OSError:
            osr = {}
        try:
            machine = _read(_hp(host, "etc/machine-id")).strip()
        except OSError:
            machine = uuid.uuid5(uuid.NAMESPACE_URL, f"lab/{host}/machine").hex
        if spec.get("runtime") == "docker":
            runtime = f"docker://{spec.get('runtime_version')}"
        else:
            pkg = (state.get("packages") or {}).get("containerd.io")
            version = pkg.split("-")[0] if pkg else str(spec.get("runtime_version"))
            runtime = "containerd://" + (_debian_containerd() if version == "debian" else version.lstrip("v"))
        return {"address": spec.get("address", ""), "arch": _ARCH.get(spec.get("arch", "x86_64"), spec.get("arch")),
                "os": osr.get("PRETTY_NAME", ""), "kernel": spec.get("kernel", ""), "machine": machine,
                "runtime": runtime, "cpus": int(spec.get("cpus", 16)), "memory_mb": int(spec.get("memory_mb", 65536)),
                "gpus": int(spec.get("gpus", 0))}
    return _memo(("facts", host), facts)  # type: ignore[no-any-return]


def _debian_containerd() -> str:
    """The version of the machine's real containerd (the lab's hosts run it): asked once per lab, kept."""
    kept = LAB_ROOT / "cache" / "containerd-version"
    with contextlib.suppress(OSError):
        return kept.read_text().strip()
    version = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        text = subprocess.run([str(LAB_ROOT / "real" / "containerd"), "--version"], capture_output=True, text=True,
                              timeout=10).stdout
        version = text.split()[2]
    with contextlib.suppress(OSError):
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(version + "\n")
    return version


def _node_index(s: dict[str, Any], name: str) -> int:
    return _memo(("node-index", id(s)), lambda: {n: i for i, n in enumerate(s.get("nodes", {}))}).get(name, 0)  # type: ignore[no-any-return]


def _pod_cidr(s: dict[str, Any], name: str) -> str:
    """The node's podCIDR: the cluster's podSubnet cut in /24s, one per node in join order (the node IPAM
    controller's default node-cidr-mask-size for IPv4)."""
    base = (s.get("pod_subnet") or "10.244.0.0/16").split("/")[0].split(".")
    i = _node_index(s, name)
    return f"{base[0]}.{int(base[1]) + i // 256}.{i % 256}.0/24"


_PRESSURE = (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
             ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
             ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))
_EPHEMERAL_KI = 101430960  # the A100 node's root filesystem (its capacity.ephemeral-storage)


def _served_node(s: dict[str, Any], name: str) -> dict[str, Any]:
    """The Node as a real API server serves it (the internal node_json dressed; the caller may change it)."""
    n = node_json(s, name)
    node = s["nodes"][name]
    f = _host_facts(node["host"])
    created = str(node.get("created") or "2026-01-01T00:00:00Z")
    md = n["metadata"]
    annotations = {"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///var/run/containerd/containerd.sock",
                   "node.alpha.kubernetes.io/ttl": "0",
                   "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
    if any("flannel" in ds["metadata"]["name"] for ds in _daemonsets(s)):  # what flannel's pod writes on its node
        annotations.update({"flannel.alpha.coreos.com/backend-data": json.dumps(
            {"VNI": 1, "VtepMAC": ":".join(hashlib.sha1(name.encode()).hexdigest()[i:i + 2] for i in range(0, 12, 2))},
            separators=(",", ":")), "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true", "flannel.alpha.coreos.com/public-ip": f["address"]})
    annotations.update(md.get("annotations") or {})
    labels = {"beta.kubernetes.io/arch": f["arch"], "beta.kubernetes.io/os": "linux", "kubernetes.io/arch": f["arch"],
              "kubernetes.io/os": "linux", **md["labels"]}
    st = n["status"]
    memory_ki = f["memory_mb"] * 1024
    base = {"cpu": str(f["cpus"]), "ephemeral-storage": f"{_EPHEMERAL_KI}Ki", "hugepages-1Gi": "0",
            "hugepages-2Mi": "0", "memory": f"{memory_ki}Ki", "pods": "110"}
    # allocatable: the kubelet's default eviction thresholds (memory.available<100Mi, nodefs.available<10%)
    alloc = {**base, "ephemeral-storage": str(_EPHEMERAL_KI * 1024 * 9 // 10), "memory": f"{memory_ki - 102400}Ki"}
    extended = lambda d: {k: v for k, v in d.items() if k not in ("cpu", "memory", "pods")}  # noqa: E731
    ready = st["conditions"][0]
    beat = _now()
    down = ready.get("reason") == "NodeStatusUnknown"
    conditions = [{**ready, "lastHeartbeatTime": created if down else beat, "lastTransitionTime": created}]
    for kind, reason, message in _PRESSURE:
        conditions.append({"lastHeartbeatTime": created if down else beat, "lastTransitionTime": created,
                           "message": "Kubelet stopped posting node status." if down else message,
                           "reason": "NodeStatusUnknown" if down else reason,
                           "status": "Unknown" if down else "False", "type": kind})
    default, handlers = _runtime_handlers(node["host"])
    version = st["nodeInfo"]["kubeletVersion"]
    cidr = _pod_cidr(s, name)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"annotations": annotations, "creationTimestamp": created, "labels": labels, "name": name,
                     "resourceVersion": str(1000 + _node_index(s, name)), "uid": _uid(node["host"], "node", created)},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], **n["spec"]},
        "status": {
            "addresses": [{"address": f["address"], "type": "InternalIP"}, {"address": name, "type": "Hostname"}],
            "allocatable": {**alloc, **extended(st["allocatable"])},
            "capacity": {**base, **extended(st["capacity"])},
            "conditions": conditions,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": _real_images(f["gpus"] > 0),
            "nodeInfo": {"architecture": f["arch"], "bootID": _uid(node["host"], "boot"),
                         "containerRuntimeVersion": f["runtime"], "kernelVersion": f["kernel"],
                         "kubeProxyVersion": version, "kubeletVersion": version, "machineID": f["machine"],
                         "operatingSystem": "linux", "osImage": f["os"], "systemUUID": _uid(node["host"], "system")},
            "runtimeHandlers": [{"features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}, "name": h}
                                for h in ["", *sorted(handlers)]],
        },
    }


_API_ACCESS = {"projected": {"defaultMode": 420, "sources": [
    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
    {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
    {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                "path": "namespace"}]}}]}}
_TOLERATIONS = [{"effect": "NoExecute", "key": k, "operator": "Exists", "tolerationSeconds": 300}
                for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")]


def _image_ref(image: str) -> str:
    """The image as the kubelet reports it (containerd's normalized name: docker.io/library/..., a tag)."""
    registry, path, tag = _ref_parts(image)
    return f"{registry}/{path}{tag or ':latest'}"


def _qos(containers: list[dict[str, Any]]) -> str:
    res = [c.get("resources") or {} for c in containers]
    if not any((r.get("requests") or r.get("limits")) for r in res):
        return "BestEffort"
    guaranteed = all({k: str(v) for k, v in (r.get("limits") or {}).items() if k in ("cpu", "memory")}
                     == {k: str(v) for k, v in {**(r.get("limits") or {}), **(r.get("requests") or {})}.items()
                         if k in ("cpu", "memory")} and {"cpu", "memory"} <= set(r.get("limits") or {}) for r in res)
    return "Guaranteed" if guaranteed else "Burstable"


def _served_pod(s: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """A pod as a real API server serves it: the stored or DaemonSet pod with the API server's defaults and the
    kubelet's status filled in where the fakes left them out (their status fields win: they carry the verdicts)."""
    md = dict(p.get("metadata") or {})
    ns, name = md.get("namespace", "default"), md.get("name", "")
    created = str(md.get("creationTimestamp") or (s.get("nodes", {}).get(p.get("spec", {}).get("nodeName"), {})
                                                  .get("created")) or "2026-01-01T00:00:00Z")
    md.setdefault("creationTimestamp", created)
    md.setdefault("uid", _uid("pod", ns, name, created))
    md.setdefault("resourceVersion", str(s.get("resource_version", 1000)))
    if md.get("ownerReferences"):
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "blockOwnerDeletion": True, "controller": True,
                                  "uid": _uid("owner", ns, str(o.get("name"))), **o} for o in md["ownerReferences"]]
    spec = dict(p.get("spec") or {})
    st = {k: v for k, v in (p.get("status") or {}).items() if k not in ("bound", "hami", "dra")}
    node = spec.get("nodeName") or st.get("hostIP")
    if node in s.get("nodes", {}):
        spec["nodeName"] = node  # the scheduler bound it (the fakes keep the node's name in hostIP)
    token = f"kube-api-access-{hashlib.sha1(md['uid'].encode()).hexdigest()[:5]}"
    mount = {"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": token, "readOnly": True}
    mounts_token = spec.get("automountServiceAccountToken") is not False and not any(
        str(v.get("name", "")).startswith("kube-api-access-") for v in spec.get("volumes") or [])  # (served before)

    def container(c: dict[str, Any]) -> dict[str, Any]:
        image = str(c.get("image", ""))
        return {"imagePullPolicy": "Always" if image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]
                else "IfNotPresent", "resources": {}, "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", **c,
                **({"volumeMounts": [*(c.get("volumeMounts") or []), mount]} if mounts_token else {})}
    tolerations = list(spec.get("tolerations") or [])
    tolerations += [t for t in _TOLERATIONS if not any(x.get("key") == t["key"] for x in tolerations)]
    spec = {"dnsPolicy": "ClusterFirst", "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0, "restartPolicy": "Always", "schedulerName": "default-scheduler", "securityContext": {},
            "serviceAccount": spec.get("serviceAccountName", "default"), "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30, **spec, "tolerations": tolerations,
            "containers": [container(c) for c in spec.get("containers") or []],
            **({"initContainers": [container(c) for c in spec["initContainers"]]}
               if spec.get("initContainers") else {}),
            **({"volumes": [*(spec.get("volumes") or []), {"name": token, **_API_ACCESS}]} if mounts_token
               else {})}
    phase = st.get("phase", "Pending")
    if node in s.get("nodes", {}):
        f = _host_facts(s["nodes"][node]["host"])
        ip = ".".join(_pod_cidr(s, node).split("/")[0].split(".")[:3]) + \
            f".{int(hashlib.sha1(md['uid'].encode()).hexdigest()[:4], 16) % 250 + 2}"
        st = {"hostIP": f["address"], "hostIPs": [{"ip": f["address"]}], "podIP": ip, "podIPs": [{"ip": ip}],
              "startTime": created, **{k: v for k, v in st.items() if k != "hostIP"}}
        running = phase == "Running"
        if "conditions" not in st:
            ready = "True" if running else "False"
            st["conditions"] = [{"lastProbeTime": None, "lastTransitionTime": created, "status": v, "type": t}
                                for t, v in (("Initialized", "True"), ("Ready", ready), ("ContainersReady", ready),
                                             ("PodScheduled", "True"))]
        if "containerStatuses" not in st and (running or phase == "Succeeded"):
            def status(c: dict[str, Any]) -> dict[str, Any]:
                ref = _image_ref(str(c.get("image", "")))
                cid = "containerd://" + hashlib.sha256(f"{md['uid']}/{c.get('name')}".encode()).hexdigest()
                state = {"running": {"startedAt": created}} if running else {"terminated": {
                    "containerID": cid, "exitCode": 0, "finishedAt": created, "reason": "Completed",
                    "startedAt": created}}
                digest = ref if "@" in ref else \
                    ref.rsplit(":", 1)[0] + "@sha256:" + hashlib.sha256(ref.encode()).hexdigest()
                return {"containerID": cid, "image": ref, "imageID": digest, "lastState": {},
                        "name": c.get("name", ""),
                        "ready": running, "restartCount": 0, "started": running, "state": state}
            st["containerStatuses"] = [status(c) for c in spec["containers"]]
    st.setdefault("phase", phase)
    st.setdefault("qosClass", _qos(spec["containers"]))
    return {**p, "apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec, "status": st}


# -- reset, drain, node deletion, etcd members (gpuk8s reset) -------------------------------------------
# etcd runs stacked on every control plane (kubeadm's default topology): the members are the control-plane
# nodes, plus those whose Node object was deleted without a kubeadm reset (their member stays in etcd),
# minus those kubeadm reset removed (its remove-etcd-member phase) while their Node object is still there.
def etcd_members(s: dict[str, Any]) -> list[str]:
    cps = {n for n, v in s.get("nodes", {}).items() if v.get("role") == "control-plane"}
    return sorted((cps | set(s.get("etcd_left", []))) - set(s.get("etcd_removed", [])))


# The text of kubeadm reset (kubernetes cmd/kubeadm/app/cmd/reset.go and phases/reset/cleanupnode.go, as
# kubeadm 1.29+ prints it; the three closing paragraphs are reset.go's iptablesCleanupInstructions and
# cniCleanupInstructions, verbatim).
_RESET_TAIL = """
The reset process does not clean CNI configuration. To do so, you must remove /etc/cni/net.d

The reset process does not reset or clean up iptables rules or IPVS tables.
If you wish to reset iptables, you must do so manually by using the "iptables" command.

If your cluster was setup to utilize IPVS, run ipvsadm --clear (or similar)
to reset your system's IPVS tables.

The reset process does not clean your kubeconfig files and you must remove them manually.
Please, check the contents of the $HOME/.kube/config file.
"""
_RESET_FILES = ("/etc/kubernetes/admin.conf", "/etc/kubernetes/super-admin.conf", "/etc/kubernetes/kubelet.conf",
                "/etc/kubernetes/bootstrap-kubelet.conf", "/etc/kubernetes/controller-manager.conf",
                "/etc/kubernetes/scheduler.conf")
_RESET_DIRS = ("/etc/kubernetes/manifests", "/var/lib/kubelet", "/etc/kubernetes/pki")


def _empty_dir(d: str) -> None:
    p = Path(d)
    if not p.is_dir():
        return
    for child in p.iterdir():
        if child.is_dir() and not child.is_symlink():
            import shutil

            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()


def _stop_apiserver(addr: str) -> None:
    """End the stand-in API server this control plane's kubeadm init started (the kubelet's static pod goes)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kube-apiserver" in argv and addr.encode() in argv and any(a.endswith(b"fake.py") for a in argv):
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), 15)


def _reset(h: Any, args: list[str]) -> int:
    if "-f" not in args and "--force" not in args:
        err("[reset] Are you sure you want to proceed? [y/N]: error: won't proceed; the user didn't answer "
            "(Y|y) in order to continue\n")
        return 1
    spec = me()
    name = spec["name"]
    with cluster_state() as s:
        node = s.get("nodes", {}).get(name)
        control_plane = bool(node and node.get("role") == "control-plane") or \
            Path("/etc/kubernetes/manifests/kube-apiserver.yaml").exists()
        # a test's etcd that refuses the removal (no quorum): kubeadm only warns and keeps the data directory
        member_kept = control_plane and node is not None and name in s.get("etcd_remove_fails", [])
        if member_kept:
            pass
        elif control_plane and node is not None:  # remove-etcd-member: the member leaves etcd, the Node stays
            removed = s.setdefault("etcd_removed", [])
            if name not in removed:
                removed.append(name)
        elif control_plane and name in s.get("etcd_left", []):
            s["etcd_left"].remove(name)
        runs_api = s.get("apiserver", "").rpartition(":")[0] == spec["address"]
    text = "[preflight] Running pre-flight checks\n"
    if member_kept:  # removeetcdmember.go's klog.Warningf, verbatim but for the klog header's time and pid
        err("W1130 10:00:00.000000    4242 removeetcdmember.go:61] [reset] Failed to remove etcd member: etcdserver: "
            "re-configuration failed due to not enough started members, please manually remove this etcd member "
            "using etcdctl\n")
    elif control_plane:
        text += "[reset] Deleted contents of the etcd data directory: /var/lib/etcd\n"
        _empty_dir("/var/lib/etcd")
    h.state.setdefault("services", {})["kubelet"] = "inactive"
    h.save()
    if runs_api:
        _stop_apiserver(spec["address"])
    text += ("[reset] Stopping the kubelet service\n"
             "[reset] Unmounting mounted directories in \"/var/lib/kubelet\"\n"
             f"[reset] Deleting contents of directories: [{' '.join(_RESET_DIRS)}]\n"
             f"[reset] Deleting files: [{' '.join(_RESET_FILES)}]\n")
    # "Unmounting mounted directories": what is mounted under /var/lib/kubelet/, deepest first, before the delete
    with contextlib.suppress(OSError):
        mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines() if len(ln.split()) > 1]
        for m in sorted((m for m in mounts if m.startswith("/var/lib/kubelet/")), reverse=True):
            subprocess.run(["umount", m.replace("\\040", " ")], check=False, capture_output=True)
    for d in _RESET_DIRS:
        _empty_dir(d)
    for f in _RESET_FILES:
        with contextlib.suppress(OSError):
            os.unlink(f)
    out(text + _RESET_TAIL)
    return 0


def _timeout_seconds(args: list[str]) -> float:
    v = _flag(args, "--timeout") or "0s"
    m = re.fullmatch(r"(\d+)(s|m|h)?", v)
    if not m:
        return 0.0
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]


def _pdb_selects(pdb: dict[str, Any], pod: dict[str, Any]) -> bool:
    want = pdb.get("spec", {}).get("selector", {}).get("matchLabels", {})
    have = pod.get("metadata", {}).get("labels", {})
    return bool(want) and all(have.get(k) == v for k, v in want.items())


def _blocking_budget(s: dict[str, Any], pod: dict[str, Any], pdbs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The PodDisruptionBudget (of `pdbs`) that allows no eviction of `pod` now (disruptionsAllowed would be 0)."""
    ns = pod["metadata"].get("namespace", "default")
    for pdb in pdbs:
        if pdb["metadata"].get("namespace", "default") != ns:
            continue
        if not _pdb_selects(pdb, pod):
            continue
        healthy = sum(1 for o in s.get("objects", {}).values() if o.get("kind") == "Pod"
                      and o["metadata"].get("namespace", "default") == ns and _pdb_selects(pdb, o))
        spec = pdb.get("spec", {})
        allowed = (healthy - int(spec["minAvailable"]) if "minAvailable" in spec
                   else int(spec.get("maxUnavailable", 1)))
        if allowed <= 0:
            return pdb
    return None


def _node_verb(verb: str, words: list[str], args: list[str]) -> int:
    """kubectl cordon/uncordon/drain NODE and delete node NODE, with kubectl's messages."""
    name = words[2] if verb == "delete" and len(words) >= 3 else (words[1] if len(words) >= 2 else "")
    if verb == "delete":
        with cluster_state() as s:
            node = s.get("nodes", {}).pop(name, None)
            if node is not None and node.get("role") == "control-plane":
                removed = s.setdefault("etcd_removed", [])
                if name in removed:
                    removed.remove(name)  # reset first: its member is gone already
                elif name not in s.setdefault("etcd_left", []):
                    s["etcd_left"].append(name)  # the Node goes, its etcd member stays
        if node is None:
            if "--ignore-not-found" in args:
                return 0
            err(f"Error from server (NotFound): nodes \"{name}\" not found\n")
            return 1
        out(f"node \"{name}\" deleted\n")
        return 0
    taint = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    with cluster_state() as s:
        node = s.get("nodes", {}).get(name)
        if node is None:
            err(f"Error from server (NotFound): nodes \"{name}\" not found\n")
            return 1
        was = bool(node.get("unschedulable"))
        node["taints"] = [t for t in node.get("taints", []) if t.get("key") != taint["key"]]
        node["unschedulable"] = verb != "uncordon"
        if verb != "uncordon":
            node["taints"].append(taint)
        ds = [f"{d['metadata'].get('namespace', 'default')}/{d['metadata']['name']}-{name}" for d in _daemonsets(s)]
        pods = [o for o in s.get("objects", {}).values() if o.get("kind") == "Pod"
                and o.get("spec", {}).get("nodeName") == name]
    if verb == "uncordon":
        out(f"node/{name} {'uncordoned' if was else 'already uncordoned'}\n")
        return 0
    out(f"node/{name} {'already cordoned' if was else 'cordoned'}\n")
    if verb == "cordon":
        return 0
    ref = lambda p: f"{p['metadata'].get('namespace', 'default')}/{p['metadata']['name']}"  # noqa: E731
    problems = []
    bare = [ref(p) for p in pods if not p["metadata"].get("ownerReferences")]
    if bare and "--force" not in args:
        problems.append(f"cannot delete Pods that declare no controller (use --force to override): {', '.join(bare)}")
    local = [ref(p) for p in pods if any("emptyDir" in v for v in p.get("spec", {}).get("volumes", []))]
    if local and "--delete-emptydir-data" not in args:
        problems.append("cannot delete Pods with local storage (use --delete-emptydir-data to override): "
                        + ", ".join(local))
    if ds and "--ignore-daemonsets" not in args:
        problems.append("cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore): " + ", ".join(ds))
    if problems:
        err(f"error: unable to drain node \"{name}\" due to error: {', '.join(problems)}, continuing command...\n"
            f"There are pending nodes to be drained:\n {name}\n" + "\n".join(problems) + "\n")
        return 1
    if ds:
        err(f"Warning: ignoring DaemonSet-managed Pods: {', '.join(ds)}\n")
    timeout = _timeout_seconds(args) or 3600.0
    deadline = time.monotonic() + timeout
    i = 0
    while i < len(pods):
        # the evictions that go through, in one write of the state (not one per pod), until one is refused
        with cluster_state() as s:
            pdbs = [o for o in s.get("objects", {}).values() if o.get("kind") == "PodDisruptionBudget"]
            while i < len(pods):
                pod = pods[i]
                ns, pname = pod["metadata"].get("namespace", "default"), pod["metadata"]["name"]
                out(f"evicting pod {ns}/{pname}\n")
                if _blocking_budget(s, pod, pdbs) is not None:
                    break
                s.get("objects", {}).pop(_key(pod), None)
                out(f"pod/{pname} evicted\n")
                i += 1
        if i == len(pods):
            break
        sys.stdout.flush()
        # kubectl's eviction retry (k8s.io/kubectl/pkg/drain): "Cannot evict pod as it would violate the
        # pod's disruption budget." is the API server's 429 message for a blocked eviction
        err(f"error when evicting pods/\"{pname}\" -n \"{ns}\" (will retry after 5s): Cannot evict pod as it "
            "would violate the pod's disruption budget.\n")
        sys.stderr.flush()
        left = deadline - time.monotonic()
        if left <= 0:
            t = _flag(args, "--timeout") or f"{int(timeout)}s"
            err(f"There are pending nodes to be drained:\n {name}\nerror: unable to drain node \"{name}\" due "
                f"to error: [error when evicting pods/\"{pname}\" -n \"{ns}\": global timeout reached: {t}], "
                "continuing command...\n")
            return 1
        time.sleep(min(5.0, left))
    out(f"node/{name} drained\n")
    return 0



# -- monitoring (issue 20): the DCGM exporter's pods, its /metrics and Prometheus's targets API -----------------
# The exporter DaemonSet's pods are placed by its nodeSelector and tolerations (_ds_places). On a node whose
# container runtime default is not nvidia the exporter crashes (CrashLoopBackOff) and logs what
# dcgm-exporter 4.8 logs when its container has no NVML (NVIDIA/dcgm-exporter issue 612, 2026-09-19):
#   level=ERROR msg="Cannot init NVML library; err: ERROR_LIBRARY_NOT_FOUND"
# Else `kubectl get --raw` of the pod's proxy path serves the Prometheus text of that node's simulated GPUs
# (one series per GPU and metric; the pod/namespace/container labels only when the DaemonSet mounts the
# kubelet's pod-resources directory and a GPU pod is bound to the node). A Prometheus (a Deployment and its
# Service) answers /api/v1/targets through the service proxy from its ConfigMap's scrape jobs.
EXPORTER_IMAGE = "dcgm-exporter"
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
NVML_LOG = ('time=2026-11-30T09:00:00.001Z level=INFO msg="Starting dcgm-exporter" Version=4.8.3\n'
            'time=2026-11-30T09:00:00.002Z level=INFO msg="Attempting to initialize DCGM."\n'
            'time=2026-11-30T09:00:00.005Z level=INFO msg="DCGM successfully initialized!"\n'
            'time=2026-11-30T09:00:00.005Z level=INFO msg="Attempting to initialize NVML library."\n'
            'time=2026-11-30T09:00:00.005Z level=ERROR msg="Cannot init NVML library; err: ERROR_LIBRARY_NOT_FOUND"\n'
            'time=2026-11-30T09:00:00.006Z level=ERROR msg=ERROR_LIBRARY_NOT_FOUND\n')
# dcgm-exporter's etc/default-counters.csv: (metric, type, help) of the series the fake serves
COUNTERS = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
)


def _is_exporter(ds: dict[str, Any]) -> bool:
    containers = ds.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    return any(EXPORTER_IMAGE in str(c.get("image", "")) for c in containers)


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and str(t.get("value", "")) == str(taint.get("value", "")):
            return True
    return False


def _ds_places(s: dict[str, Any], ds: dict[str, Any], name: str, node: dict[str, Any]) -> bool:
    """Whether the DaemonSet runs a pod on the node: its nodeSelector matches (_runs_on) and, for the DCGM
    exporter, it tolerates every NoSchedule/NoExecute taint of the node (the other DaemonSets keep the lab's
    placement by selector only, which their tests rely on)."""
    if not _runs_on(ds, _node_labels(name, node)):
        return False
    if not _is_exporter(ds):
        return True
    spec = ds.get("spec", {}).get("template", {}).get("spec", {})
    return all(_tolerates(spec.get("tolerations") or [], t) for t in node.get("taints", [])
               if t.get("effect") in ("NoSchedule", "NoExecute"))


def _nvml_fails(ds: dict[str, Any], node: dict[str, Any]) -> bool:
    """The exporter gets the driver's libraries only from the nvidia runtime (the default, or its RuntimeClass)."""
    default, handlers = _runtime_handlers(node["host"])
    rc = ds.get("spec", {}).get("template", {}).get("spec", {}).get("runtimeClassName")
    return not (default == "nvidia" or (rc == "nvidia" and "nvidia" in handlers))


def sandbox_refused(host: str, spec: dict[str, Any]) -> str | None:
    """The kubelet's FailedCreatePodSandBox message for a pod whose runtimeClassName names a handler the node's
    containerd does not have, else None. containerd 1.x: "failed to get sandbox runtime: no runtime for "nvidia" is
    configured" (tests/fixtures/real/kubernetes/kubelet/sandbox-no-runtime-nvidia-kind.txt); 2.x: "unable to get OCI
    runtime for sandbox "<id>": no runtime for ..." (sandbox-no-runtime-nvidia-containerd2.txt). The pod stays in
    ContainerCreating; the lab let it start and fail (StartError) before."""
    rc = spec.get("runtimeClassName")
    if not rc or rc in _runtime_handlers(host)[1]:
        return None
    runtime = _host_facts(host)["runtime"]
    if not runtime.startswith("containerd://"):
        return None  # cri-dockerd has no runtime handlers of its own
    head = "Failed to create pod sandbox: rpc error: code = Unknown desc = "
    major = runtime.removeprefix("containerd://").split(".")[0]
    if major.isdigit() and int(major) >= 2:
        sandbox = hashlib.sha256(f"{host}/{json.dumps(spec, sort_keys=True)}".encode()).hexdigest()
        return f'{head}unable to get OCI runtime for sandbox "{sandbox}": no runtime for "{rc}" is configured'
    return f'{head}failed to get sandbox runtime: no runtime for "{rc}" is configured'


def creating(spec: dict[str, Any]) -> dict[str, Any]:
    """A pod whose sandbox cannot be made: Pending, every container waiting in ContainerCreating."""
    waiting = {"waiting": {"reason": "ContainerCreating"}}
    return {"phase": "Pending", "containerStatuses": [
        {"name": c.get("name", ""), "ready": False, "restartCount": 0, "state": waiting}
        for c in spec.get("containers", [])]}


def _ds_pod_status(s: dict[str, Any], ds: dict[str, Any], node: dict[str, Any], phase: str) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if _is_exporter(ds) and _nvml_fails(ds, node):
        status["containerStatuses"] = [{"name": "dcgm-exporter", "ready": False, "restartCount": 5,
                                        "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
    return status


def _mounts_pod_resources(ds: dict[str, Any]) -> bool:
    spec = ds.get("spec", {}).get("template", {}).get("spec", {})
    vols = {v.get("name"): v for v in spec.get("volumes") or []}
    return any((vols.get(m.get("name"), {}).get("hostPath") or {}).get("path") == POD_RESOURCES
               for c in spec.get("containers", []) for m in c.get("volumeMounts") or [])


def _exporter_pod(s: dict[str, Any], ns: str, pod: str) -> tuple[dict[str, Any], str] | None:
    """(the exporter DaemonSet, its node) of an exporter pod name, as _pods names them."""
    for ds in _daemonsets(s):
        if _is_exporter(ds) and ds["metadata"].get("namespace", "default") == ns:
            for name, n in s.get("nodes", {}).items():
                if pod == f"{ds['metadata']['name']}-{name}" and _ds_places(s, ds, name, n):
                    return ds, name
    return None


def _pod_ip(node: str) -> str:
    return f"10.244.{sum(node.encode()) % 250}.{len(node) + 2}"


def _gpu_pods(s: dict[str, Any], node: str) -> list[tuple[dict[str, Any], int]]:
    """The pods bound to the node that hold GPUs, with how many (the kubelet's pod-resources would list them)."""
    out = []
    for o in s.get("objects", {}).values():
        spec = o.get("spec", {})
        if o.get("kind") != "Pod" or (spec.get("nodeName") or spec.get("nodeSelector", {}).get(
                "kubernetes.io/hostname")) != node:
            continue
        want = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                   for c in spec.get("containers", []))
        if want:
            out.append((o, want))
    return out


def _metrics(s: dict[str, Any], ds: dict[str, Any], node: str) -> str:
    host = s["nodes"][node]["host"]
    spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
    model, mem = spec.get("gpu_model", "NVIDIA A100-SXM4-80GB"), int(spec.get("gpu_memory_mib", 81920))
    owner: dict[int, tuple[str, str, str]] = {}
    if _mounts_pod_resources(ds):
        i = 0
        for pod, n in _gpu_pods(s, node):
            for _ in range(n):
                c = pod.get("spec", {}).get("containers", [{}])[0].get("name", "")
                owner[i] = (pod["metadata"]["name"], pod["metadata"].get("namespace", "default"), c)
                i += 1
    # the exporter's default (--devices f): a GPU whose MIG mode is on is published per GPU instance (the parent's gpu
    # and UUID, GPU_I_PROFILE and GPU_I_ID) and never as a whole; no _UTIL field for an instance (NVIDIA/dcgm-exporter
    # #430), nor FB_USED/FB_FREE on an H100's (#512, #380): tests/fixtures/real/dcgm/mig-*
    instances = _mig_instances(host)
    lines = []
    for metric, kind, help_text in COUNTERS:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for g in range(_gpus_on(host)):
            labels = (f'gpu="{g}",UUID="GPU-{host}-{g:04d}-lab",pci_bus_id="00000000:{0x10 + g:02X}:00.0",'
                      f'device="nvidia{g}",modelName="{model}"')
            driver = _loaded_driver(host) or spec.get("driver") or "535.104.05"
            rest = f',Hostname="{node}",DCGM_FI_DRIVER_VERSION="{driver}"'
            gis = instances.get(g)
            if gis is not None:
                if metric == "DCGM_FI_DEV_GPU_UTIL" or (metric.startswith("DCGM_FI_DEV_FB_") and "H100" in model):
                    continue
                for gi, profile in gis:
                    lines.append(f'{metric}{{{labels},GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}"{rest}}} '
                                 + str({"DCGM_FI_DEV_GPU_TEMP": 34 + g, "DCGM_FI_DEV_POWER_USAGE": 61.5,
                                        "DCGM_FI_DEV_XID_ERRORS": 0, "DCGM_FI_DEV_FB_USED": 0,
                                        "DCGM_FI_DEV_FB_FREE": 0}[metric]))
                continue
            labels += rest
            if g in owner:
                labels += ',pod="{}",namespace="{}",container="{}"'.format(*owner[g])
            value = {"DCGM_FI_DEV_GPU_TEMP": 34 + g, "DCGM_FI_DEV_POWER_USAGE": 61.5,
                     "DCGM_FI_DEV_GPU_UTIL": 87 if g in owner else 0, "DCGM_FI_DEV_XID_ERRORS": 0,
                     "DCGM_FI_DEV_FB_USED": 1024 if g in owner else 0,
                     "DCGM_FI_DEV_FB_FREE": mem - (1024 if g in owner else 0)}[metric]
            lines.append(f"{metric}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def _targets(s: dict[str, Any], ns: str) -> dict[str, Any]:
    """/api/v1/targets of the Prometheus in `ns`: its ConfigMap's kubernetes_sd endpoints jobs, relabelled."""
    cm = s.get("objects", {}).get(f"ConfigMap/{ns}/prometheus-config", {})
    cfg = yaml.safe_load((cm.get("data") or {}).get("prometheus.yml") or "{}") or {}
    active = []
    for job in cfg.get("scrape_configs") or []:
        for sd in job.get("kubernetes_sd_configs") or []:
            if sd.get("role") != "endpoints":
                continue
            names = (sd.get("namespaces") or {}).get("names")
            for svc in [o for o in s.get("objects", {}).values() if o.get("kind") == "Service"]:
                sns = svc["metadata"].get("namespace", "default")
                sel = svc.get("spec", {}).get("selector") or {}
                if names and sns not in names or not sel:
                    continue
                for ds in _daemonsets(s):
                    pod_labels = ds.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
                    if ds["metadata"].get("namespace", "default") != sns or \
                            any(pod_labels.get(k) != v for k, v in sel.items()):
                        continue
                    for node, n in s.get("nodes", {}).items():
                        if not _ds_places(s, ds, node, n):
                            continue
                        for port in svc.get("spec", {}).get("ports", []):
                            meta = {"__meta_kubernetes_service_name": svc["metadata"]["name"],
                                    "__meta_kubernetes_endpoint_port_name": str(port.get("name", "")),
                                    "__meta_kubernetes_pod_node_name": node, "__meta_kubernetes_namespace": sns,
                                    "__address__": f"{_pod_ip(node)}:{port.get('port')}"}
                            labels = {"job": job["job_name"], "instance": meta["__address__"]}
                            keep = True
                            for rc in job.get("relabel_configs") or []:
                                value = ";".join(meta.get(k, "") for k in rc.get("source_labels", []))
                                if rc.get("action") == "keep":
                                    keep = keep and re.fullmatch(rc.get("regex", "(.*)"), value) is not None
                                elif rc.get("target_label"):
                                    labels[rc["target_label"]] = value
                            if not keep:
                                continue
                            url = f"http://{meta['__address__']}/metrics"
                            down = _is_exporter(ds) and _nvml_fails(ds, n)
                            active.append({"discoveredLabels": meta, "labels": labels, "scrapePool": job["job_name"],
                                           "scrapeUrl": url, "globalUrl": url,
                                           "lastError": f"Get \"{url}\": dial tcp {meta['__address__']}: connect: "
                                                        "connection refused" if down else "",
                                           "lastScrape": "2026-11-30T09:00:00Z", "lastScrapeDuration": 0.01,
                                           "health": "down" if down else "up", "scrapeInterval": "15s",
                                           "scrapeTimeout": "10s"})
    return {"status": "success", "data": {"activeTargets": active, "droppedTargets": []}}


def _raw_get(s: dict[str, Any], path: str) -> int:
    if path in ("/readyz", "/livez"):  # the API server answers (kubectl has reached it): kube-apiserver's "ok"
        out("ok")
        return 0
    m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/:]+):(\d+)/proxy/metrics", path)
    if m:
        ns, pod, port = m.groups()
        found = _exporter_pod(s, ns, pod)
        if found is None:
            err(f"Error from server (NotFound): pods \"{pod}\" not found\n")
            return 1
        ds, node = found
        if port != "9400" or _nvml_fails(ds, s["nodes"][node]):
            # the API server's proxy (k8s.io/apimachinery/pkg/util/proxy): "error trying to reach service"
            err(f"Error from server (ServiceUnavailable): error trying to reach service: dial tcp "
                f"{_pod_ip(node)}:{port}: connect: connection refused\n")
            return 1
        out(_metrics(s, ds, node))
        return 0
    m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/services/([^/:]+):(\d+)/proxy/api/v1/targets", path)
    if m:
        ns, svc, _port = m.groups()
        if f"Service/{ns}/{svc}" not in s.get("objects", {}):
            err(f"Error from server (NotFound): services \"{svc}\" not found\n")
            return 1
        if f"Deployment/{ns}/prometheus" not in s.get("objects", {}):
            err(f"Error from server (ServiceUnavailable): no endpoints available for service \"{svc}\"\n")
            return 1
        out(json.dumps(_targets(s, ns)) + "\n")
        return 0
    err("Error from server (NotFound): the server could not find the requested resource\n")
    return 1


def _monitoring_kubectl(verb: str, words: list[str], args: list[str]) -> int | None:
    """kubectl get --raw, and the logs of an exporter pod; None: not for this part of the fake."""
    if verb == "get" and _flag(args, "--raw"):
        return _raw_get(read_state(), _flag(args, "--raw") or "")
    if verb == "logs" and len(words) >= 2:
        s = read_state()
        found = _exporter_pod(s, _flag(args, "-n") or "default", words[1])
        if found is None:
            return None
        ds, node = found
        out(NVML_LOG if _nvml_fails(ds, s["nodes"][node]) else
            'time=2026-11-30T09:00:00.001Z level=INFO msg="Starting webserver"\n')
        return 0
    return None


def _delete_any(s: dict[str, Any], kind: str, ns: str, name: str) -> bool:
    """kubectl delete KIND NAME for any kind of stored object (kubectl accepts the lower-case kind)."""
    for key in list(s.get("objects", {})):
        k, kns, kname = key.split("/", 2)
        if k.lower() in (kind.lower(), kind.lower().removesuffix("s")) and kname == name and kns in (ns, ""):
            del s["objects"][key]
            return True
    return False


# -- kubeadm upgrade, kubectl cordon/uncordon/drain, kubelet versions (issue 22) --------------------------
# Messages are kubeadm's and kubectl's own: cmd/kubeadm/app/cmd/upgrade/apply.go ("[upgrade/successful]
# SUCCESS! Your cluster was upgraded to %q. Enjoy!", "[upgrade/kubelet] Now that your control plane is
# upgraded, ..."), node.go ("[upgrade] The configuration for this node was successfully updated!", "[upgrade]
# Now you should go ahead and upgrade the kubelet package using your package manager."), phases/upgrade/
# policy.go ("Specified version to upgrade to %q is too high; kubeadm can upgrade only 1 minor version at a
# time", "... is higher than the kubeadm version %q. Upgrade kubeadm first using the tool you used to install
# kubeadm", "... is at least one minor release higher than the kubeadm minor release (%d > %d). Such an upgrade
# is not supported"), quoted in operators' transcripts found with `search`. kubectl cordon/drain/uncordon:
# _node_verb above.
_KUBEADM_VERSION_RE = re.compile(r"^v?1\.(\d+)\.(\d+)$")


def _v(version: str) -> tuple[int, int]:
    m = _KUBEADM_VERSION_RE.match(version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _kubeadm_version(h: Any) -> str:
    return "v" + h.state.get("packages", {}).get("kubeadm", "1.30.0-1.1").split("-")[0]


def _kubelet_version(host: str) -> str | None:
    """The kubelet a node runs: the kubelet package installed on its host (the lab restarts it at once)."""
    try:
        st = _read_json(_hp(host, "var_lib/gpuk8s-lab/state.json"))
    except (OSError, ValueError):
        return None
    v = st.get("packages", {}).get("kubelet")
    return "v" + v.split("-")[0] if v else None


def _manifest_version(version: str) -> None:
    """The static pods of this control plane at `version` (kubeadm writes the images' tags)."""
    d = Path("/etc/kubernetes/manifests")
    d.mkdir(parents=True, exist_ok=True)
    for comp in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        p = d / f"{comp}.yaml"
        try:
            doc = yaml.safe_load(p.read_text()) or {}
        except (OSError, ValueError):
            doc = {}
        doc.setdefault("apiVersion", "v1")
        doc.setdefault("kind", "Pod")
        doc.setdefault("metadata", {"name": comp, "namespace": "kube-system"})
        containers = doc.setdefault("spec", {}).setdefault("containers", [{"name": comp}])
        containers[0]["image"] = f"registry.k8s.io/{comp}:{version}"
        p.write_text(yaml.safe_dump(doc))


def _upgrade_fatal(lines: list[str]) -> int:
    err("[upgrade/version] FATAL: the --version argument is invalid due to these fatal errors:\n\n"
        + "".join(f"\t- {ln}\n\n" for ln in lines) + "Please fix the misalignments highlighted above and try "
        "upgrading again\nTo see the stack trace of this error execute with --v=5 or higher\n")
    return 1


def _upgrade(h: Any, args: list[str]) -> int:
    """kubeadm upgrade plan [VERSION] | apply VERSION [-y] | node, on the simulated cluster."""
    verb = args[0] if args else ""
    if not Path("/etc/kubernetes/admin.conf").exists() and verb != "node":
        err("[upgrade/config] FATAL: failed to load admin kubeconfig: open /etc/kubernetes/admin.conf: no such "
            "file or directory\n")
        return 1
    s = read_state()
    cluster = s.get("version", "v1.30.0")
    kubeadm_v = _kubeadm_version(h)
    out("[upgrade/config] Reading configuration from the \"kubeadm-config\" ConfigMap in namespace \"kube-system\"...\n"
        "[preflight] Running pre-flight checks.\n")
    if verb == "node":
        if Path("/etc/kubernetes/manifests/kube-apiserver.yaml").exists():
            _manifest_version(cluster)
            out(f"[upgrade] Upgrading your Static Pod-hosted control plane instance to version \"{cluster}\"...\n")
        else:
            out("[preflight] Skipping prepull. Not a control plane node.\n[upgrade] Skipping phase. Not a control "
                "plane node.\n")
        out("[kubelet-start] Writing kubelet configuration to file \"/var/lib/kubelet/config.yaml\"\n"
            "[upgrade] The configuration for this node was successfully updated!\n"
            "[upgrade] Now you should go ahead and upgrade the kubelet package using your package manager.\n")
        return 0
    words = [a for a in args[1:] if not a.startswith("-")]
    target = words[0] if words else kubeadm_v
    target = target if target.startswith("v") else "v" + target
    kubelets = {name: _kubelet_version(n["host"]) or cluster for name, n in s.get("nodes", {}).items()}
    if verb == "plan":
        out(f"[upgrade] Running cluster health checks\n[upgrade] Fetching available versions to upgrade to\n"
            f"[upgrade/versions] Cluster version: {cluster}\n[upgrade/versions] kubeadm version: {kubeadm_v}\n\n"
            "Components that must be upgraded manually after you have upgraded the control plane with "
            "'kubeadm upgrade apply':\nCOMPONENT   NODE      CURRENT    TARGET\n")
        for name, v in sorted(kubelets.items()):
            out(f"kubelet     {name}  {v}   {target}\n")
        out("\nUpgrade to the latest stable version:\n\nCOMPONENT                 NODE      CURRENT    TARGET\n")
        for comp in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
            out(f"{comp:<25} {'':<9} {cluster:<10} {target}\n")
        out(f"\nYou can now apply the upgrade by executing the following command:\n\n\tkubeadm upgrade apply "
            f"{target}\n\n")
        return 0
    if verb != "apply":
        err(f"kubeadm upgrade {verb}: not simulated in the lab\n")
        return 1
    if not _KUBEADM_VERSION_RE.match(target):
        err(f"[upgrade/version] FATAL: couldn't parse version {target!r}\n")
        return 1
    fatal = []
    (tm, tp), (cm, cp_), (km, kp) = _v(target), _v(cluster), _v(kubeadm_v)
    if tm > cm + 1:
        fatal.append(f"Specified version to upgrade to \"{target}\" is too high; kubeadm can upgrade only 1 minor "
                     "version at a time")
    if tm > km:
        fatal.append(f"Specified version to upgrade to \"{target}\" is at least one minor release higher than the "
                     f"kubeadm minor release ({tm} > {km}). Such an upgrade is not supported")
    if fatal:
        return _upgrade_fatal(fatal)
    if (tm, tp) < (cm, cp_):
        return _upgrade_fatal([f"Specified version to upgrade to \"{target}\" is equal to or lower than the cluster "
                               f"version \"{cluster}\". Downgrades are not supported yet"])
    if (tm, tp) > (km, kp):
        err(f"[upgrade/version] FATAL: the --version argument is invalid due to these errors:\n\n\t- Specified "
            f"version to upgrade to \"{target}\" is higher than the kubeadm version \"{kubeadm_v}\". Upgrade kubeadm "
            "first using the tool you used to install kubeadm\n\nCan be bypassed if you pass the --force flag\n")
        return 1
    # the kubelet version skew policy: kubelets at most three minors older than the API server
    old = sorted(v for v in kubelets.values() if _v(v)[0] < tm - 3)
    if old:
        err(f"[upgrade/version] FATAL: the --version argument is invalid due to these errors:\n\n\t- There are "
            f"kubelets in this cluster that are too old that have these versions {old}\n\n"
            "Can be bypassed if you pass the --force flag\n")
        return 1
    if not ({"-y", "--yes", "-f", "--force"} & set(args)):
        err("[upgrade/confirm] Are you sure you want to proceed with the upgrade? [y/N]: \nwon't proceed; the user "
            "didn't answer (Y|y) in order to continue\n")
        return 1
    _manifest_version(target)
    with cluster_state() as st:
        st["version"] = target
    out(f"[upgrade/version] You have chosen to change the cluster version to \"{target}\"\n"
        f"[upgrade/versions] Cluster version: {cluster}\n[upgrade/versions] kubeadm version: {kubeadm_v}\n"
        "[addons] Applied essential addon: CoreDNS\n[addons] Applied essential addon: kube-proxy\n\n"
        f"[upgrade/successful] SUCCESS! Your cluster was upgraded to \"{target}\". Enjoy!\n\n"
        "[upgrade/kubelet] Now that your control plane is upgraded, please proceed with upgrading your kubelets if "
        "you haven't already done so.\n")
    return 0


def _lab_running(s: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any] | None:
    """A pod annotated lab.gpuk8s.io/runs-seconds: N runs for N seconds after it was created, then succeeds."""
    ann = pod.get("metadata", {}).get("annotations", {}) or {}
    secs = ann.get("lab.gpuk8s.io/runs-seconds")
    created = ann.get("lab.gpuk8s.io/created")
    if secs is None or created is None:
        return None
    node = pod.get("spec", {}).get("nodeName")
    if time.time() < float(created) + float(secs):
        return {"phase": "Running", "hostIP": node}
    return {"phase": "Succeeded", "hostIP": node}


# -- the scheduler for pods not pinned to a node, its events, the device plugin's logs (gpuk8s doctor, issue 19) --
# A pod without nodeName, kubernetes.io/hostname selector, metadata.name matchFields or schedulerName is placed by
# the default scheduler's filters, in its default plugin order (pkg/scheduler/apis/config/v1/default_plugins.go):
# NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit; the first that fails is the node's reason.
# The texts are kube-scheduler's: "node(s) were unschedulable", "node(s) had untolerated taint {%s: %s}",
# "node(s) didn't match Pod's node affinity/selector", "Insufficient %s"; FitError.Error() joins the sorted
# "N reason" histogram: "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node
# affinity/selector. preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, 2
# Preemption is not helpful for scheduling." (as users quote it: NVIDIA/k8s-device-plugin#430, #421). A bound
# pod's containers start only with the nvidia runtime (the node's default, or runtimeClassName nvidia), and an
# nvidia/cuda image newer than the node driver's CUDA is refused by nvidia-container-cli's requirement check
# ("requirement error: unsatisfied condition: cuda>=12.4, please update your driver to a newer version, or use an
# earlier cuda container", NVIDIA/nvidia-docker#1442). `kubectl get events` lists a FailedScheduling event per
# pod the scheduler cannot place; `kubectl logs` of a device plugin pod prints what the plugin logs on that node
# (v0.17's factory.go lines when NVML cannot load, NVIDIA/k8s-device-plugin#1220 and awslabs/amazon-eks-ami#1744;
# "Starting to serve 'nvidia.com/gpu' on /var/lib/kubelet/device-plugins/nvidia-gpu.sock" when it registers).
_TAINT_FILTERED = ("NoSchedule", "NoExecute")


def _pinned(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec", {})
    terms = (spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
             .get("nodeSelectorTerms", []))
    by_field = any(f.get("key") == "metadata.name" for t in terms for f in t.get("matchFields", []))
    return bool(spec.get("nodeName") or spec.get("nodeSelector", {}).get("kubernetes.io/hostname") or by_field)


def _pinned_node(pod: dict[str, Any]) -> str | None:
    """The node a pinned pod names (nodeName, the hostname selector, or a metadata.name matchFields)."""
    spec = pod.get("spec", {})
    terms = (spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
             .get("nodeSelectorTerms", []))
    by_field = [v for t in terms for f in t.get("matchFields", []) if f.get("key") == "metadata.name"
                for v in f.get("values", [])]
    return (spec.get("nodeName") or spec.get("nodeSelector", {}).get("kubernetes.io/hostname")
            or next(iter(by_field), None))


def _ext_requests(pod: dict[str, Any]) -> dict[str, int]:
    """Every extended resource (a name with a '/') the pod's containers ask for."""
    out: dict[str, int] = {}
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources", {}) or {}
        mine = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for k, v in mine.items():
            if "/" in k and not k.startswith("kubernetes.io/"):
                out[k] = out.get(k, 0) + int(v)
    return out


def _filter(s: dict[str, Any], pod: dict[str, Any], name: str, n: dict[str, Any]) -> list[str]:
    """Why the node cannot take the pod (the first failing filter's reasons); [] when it can."""
    spec = pod.get("spec", {})
    # kube-scheduler's NodeUnschedulable: a cordoned node takes a pod that tolerates the taint
    # node.kubernetes.io/unschedulable:NoSchedule (node_unschedulable.go)
    if n["spec"].get("unschedulable") and not _tolerates(spec.get("tolerations") or [], {
            "key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
        return ["node(s) were unschedulable"]
    for t in n["spec"].get("taints", []):
        if t.get("effect") in _TAINT_FILTERED and not _tolerates(spec.get("tolerations") or [], t):
            return [_taint_reason(s, t["key"], t.get("value", ""))]
    if not _runs_on({"spec": {"template": {"spec": spec}}}, n["metadata"]["labels"]):
        return ["node(s) didn't match Pod's node affinity/selector"]
    alloc = n["status"]["allocatable"]
    by_dra: set[str] = set()
    if _dra_needed(s, pod):
        if _dra_fit(s, pod, name) is None:
            return ["cannot allocate all claims"]
        by_dra = {k for k in _ext_requests(pod) if int(alloc.get(k, 0)) == 0 and _minor(s) >= 37
                  and _extended_class(s, k)}
    used = _used_before(s, pod, name)
    return [f"Insufficient {k}" for k, v in sorted(_ext_requests(pod).items())
            if k not in by_dra and int(alloc.get(k, 0)) - used.get(k, 0) < v]


def _minor(s: dict[str, Any]) -> int:
    """The control plane's minor (the scheduler's): 30 for v1.30.0."""
    parts = str(s.get("version", "v1.30.0")).lstrip("v").split(".")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 30


def _taint_reason(s: dict[str, Any], key: str, value: str) -> str:
    """The TaintToleration filter's reason: the taint named, "{key: value}", from 1.24 to 1.34; from 1.35 not named,
    "node(s) had untolerated taint(s)" (kubernetes PR 134740; the 1.35 kind cluster's event in
    tests/fixtures/real/kubernetes/scheduler/taints-unnamed-dra-kind.txt)."""
    if _minor(s) >= 35:
        return "node(s) had untolerated taint(s)"
    return f"node(s) had untolerated taint {{{key}: {value}}}"


def _fit_error(s: dict[str, Any], reasons: dict[str, list[str]], claims: bool = False) -> str:
    total = len(reasons)
    hist: dict[str, int] = {}
    pre: dict[str, int] = {}
    for rs in reasons.values():
        for r in rs:
            hist[r] = hist.get(r, 0) + 1
        p = ("No preemption victims found for incoming pod" if all(r.startswith("Insufficient") for r in rs)
             else "Preemption is not helpful for scheduling")
        pre[p] = pre.get(p, 0) + 1
    body = ", ".join(sorted(f"{c} {r}" for r, c in hist.items()))
    # From 1.34 (DRA GA, its DynamicResources plugin on by default) that plugin's PostFilter message comes before
    # preemption's: "... taint(s). no new claims to deallocate, preemption: 0/2 nodes are available: ..." (the same
    # real event)
    # (a pod with claims: "still not schedulable", kubernetes/kubernetes issue 133531's 1.34 condition)
    dra = ("still not schedulable, " if claims else "no new claims to deallocate, ") if _minor(s) >= 34 else ""
    return (f"0/{total} nodes are available: {body}. {dra}preemption: 0/{total} nodes are available: "
            + ", ".join(sorted(f"{c} {r}" for r, c in pre.items())) + ".")


def _loaded_driver(host: str) -> str:
    """The host's loaded driver module (its state), '' where the state does not say."""
    return str((_read_json(_hp(host, "var_lib/gpuk8s-lab/state.json")).get("driver") or {}).get("loaded") or "")


def _driver_cuda(host: str) -> tuple[int, ...]:
    spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
    loaded = _loaded_driver(host)
    cuda_of = (sys.modules.get("fake") or sys.modules.get("__main__")).cuda_of  # fakes/fake.py's table
    return tuple(int(x) for x in cuda_of(str(loaded or spec.get("driver") or "535.104.05")).split("."))


def _start(s: dict[str, Any], pod: dict[str, Any], node: str) -> dict[str, Any]:
    """A bound pod's containers: started, or refused as the runtime refuses them."""
    host = s["nodes"][node]["host"]
    dra = (_dra_fit(s, pod, node) or []) if _dra_needed(s, pod) else []
    wants_gpu = any(k.startswith("nvidia.com/") for k in _ext_requests(pod)) or bool(dra)
    ok = {"phase": "Running" if _runs_forever(pod) else "Succeeded", "hostIP": node, "bound": True,
          **({"dra": dra} if dra else {})}
    if sandbox_refused(host, pod.get("spec", {})):
        return {**creating(pod.get("spec", {})), "hostIP": node, "bound": True}
    if not wants_gpu:
        return ok
    default, handlers = _runtime_handlers(host)
    rc = pod.get("spec", {}).get("runtimeClassName")
    nvidia = default == "nvidia" or (rc == "nvidia" and "nvidia" in handlers)
    if dra:  # the DRA driver's devices come through CDI, whatever the runtime
        nvidia = _cdi_enabled(host)
    for c in pod.get("spec", {}).get("containers", []):
        cmd = (c.get("command") or [""])[0]
        if not nvidia and cmd == "nvidia-smi":
            # runc without the toolkit's hook: no nvidia-smi in a plain image (containerd's task error)
            msg = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc "
                   "create failed: unable to start container process: exec: \"nvidia-smi\": executable file not "
                   "found in $PATH: unknown")
            return {**ok, "phase": "Failed", "containerStatuses": [{"name": c.get("name", ""), "restartCount": 0,
                    "state": {"terminated": {"reason": "StartError", "exitCode": 128, "message": msg}}}]}
        m = re.match(r"^(?:.*/)?cuda:(\d+)\.(\d+)", str(c.get("image", "")))
        if nvidia and m and (int(m.group(1)), int(m.group(2))) > _driver_cuda(host):
            msg = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc "
                   "create failed: unable to start container process: error during container init: error running "
                   "prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n"
                   f"nvidia-container-cli: requirement error: unsatisfied condition: cuda>={m.group(1)}."
                   f"{m.group(2)}, please update your driver to a newer version, or use an earlier cuda container: "
                   "unknown")
            return {**ok, "phase": "Failed", "containerStatuses": [{"name": c.get("name", ""), "restartCount": 0,
                    "state": {"terminated": {"reason": "StartError", "exitCode": 128, "message": msg}}}]}
    return ok


def _schedule(s: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any] | None:
    """Where the default scheduler puts a pod that is not pinned (None: pinned, or another scheduler's, decided as
    before). A pod naming a scheduler that does not run stays Pending: nobody binds it, no event says why."""
    sched = pod.get("spec", {}).get("schedulerName")
    if sched and sched != "default-scheduler":
        if not _pinned(pod) and not _named(s, "Deployment", sched):
            return {"phase": "Pending"}
        return None
    claims = _dra_needed(s, pod)
    names = sorted(s.get("nodes", {}))
    if _pinned(pod):
        if not claims:
            return None
        names = [n for n in [_pinned_node(pod)] if n in s.get("nodes", {})]
    reasons: dict[str, list[str]] = {}
    for name in names:
        n = node_json(s, name)
        why = _filter(s, pod, name, n) if n["status"]["conditions"][0]["status"] == "True" else \
            [_taint_reason(s, "node.kubernetes.io/not-ready", "")]
        if not why:
            return _start(s, pod, name)
        reasons[name] = why
    if not reasons:
        return {"phase": "Pending"}
    return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                "message": _fit_error(s, reasons, claims)}]}


# -- Dynamic Resource Allocation (issue 33, docs/dra.md) -----------------------------------------------------------
# What decides (so that the lab proves gpuk8s's manifests and checks, not itself):
# - NVIDIA's DRA kubelet plugin (a DaemonSet whose container runs gpu-kubelet-plugin) publishes, on each node where
#   its pod lands (nodeSelector and affinity, the image pulled) and the host's driver loads, one ResourceSlice of
#   driver gpu.nvidia.com: one device gpu-<i> per GPU (type gpu), or per MIG device of a MIG-enabled GPU (type mig,
#   with its profile and parentUUID), in the shape of the real 25.12.0 slice (tests/fixtures/real/dra, 8x H100);
# - a pod's ResourceClaims (from a ResourceClaimTemplate or a claim by name) are allocated by the scheduler, in the
#   pods' creation order, from the devices of a node not held by an earlier pod: each request `exactly` (count, by
#   default 1) from the devices its DeviceClass selects and its own selectors select. The CEL the lab evaluates is
#   a conjunction of `device.driver == '...'`, `device.attributes['D'].NAME == '...'` and
#   `device.capacity['D'].memory.compareTo(quantity('...')) OP 0`; any other expression selects nothing (the real
#   scheduler evaluates full CEL). A pod no node can serve stays Pending with kube-scheduler's "cannot allocate all
#   claims" and the DynamicResources PostFilter's "still not schedulable" (kubernetes/kubernetes issue 133531,
#   tests/fixtures/real/kubernetes/scheduler/dra-cannot-allocate-all-claims-1.34.txt);
# - from 1.37 (KEP-5004 GA) a container's `nvidia.com/gpu` limit on a node whose allocatable lacks it is served from
#   the DeviceClass whose extendedResourceName names it, as a claim the scheduler makes;
# - the devices reach the container through CDI: on containerd 2.x unless enable_cdi is false, on 1.x only with
#   enable_cdi = true; else the container has no GPU (nvidia-smi not found, as with runc without the toolkit).
# `kubectl get resourceslices` and `get resourceclaims` serve these, the claims with their allocation and the pods
# they are reserved for, as the real objects are (resource.k8s.io/v1).
DRA_DRIVER = "gpu.nvidia.com"
_DRA_TERM = re.compile(
    r"""^\s*(?:device\.driver\s*==\s*['"](?P<driver>[^'"]*)['"]"""
    r"""|device\.attributes\[['"](?P<domain>[^'"]+)['"]\]\.(?P<attr>\w+)\s*==\s*['"](?P<value>[^'"]*)['"]"""
    r"""|device\.capacity\[['"][^'"]+['"]\]\.memory\.compareTo\(quantity\(['"](?P<qty>[^'"]+)['"]\)\)\s*"""
    r"""(?P<op>>=|<=|==|>|<)\s*0)\s*$""")


def _dra_plugin(s: dict[str, Any]) -> dict[str, Any] | None:
    def find() -> dict[str, Any] | None:
        for ds in _daemonsets(s):
            for c in _pod_spec(ds).get("containers", []):
                if "gpu-kubelet-plugin" in " ".join(map(str, (c.get("command") or []) + (c.get("args") or []))):
                    return ds
        return None
    return _memo(("dra-plugin", id(s)), find)  # type: ignore[no-any-return]


def _dra_template_device() -> dict[str, Any]:
    """The real slice's first GPU device (8x H100, chart 25.12.0): the shape every lab device has."""
    def load() -> dict[str, Any]:
        try:
            text = _read(REAL / "resourceslices.yaml")
        except OSError:
            return {"attributes": {}, "capacity": {}}
        doc = _parse_cached(text.partition("\n---\n")[2], "yaml")
        sl = next(i for i in doc["items"] if i["spec"]["driver"] == DRA_DRIVER)
        return dict(sl["spec"]["devices"][0])
    return _memo(("dra-template",), load)  # type: ignore[no-any-return]


def _quantity_mib(q: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", q.strip())
    if not m:
        return -1.0
    scale = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 ** 2, "k": 1000 / 2 ** 20, "M": 1e6 / 2 ** 20,
             "G": 1e9 / 2 ** 20, "T": 1e12 / 2 ** 20, None: 1 / 2 ** 20}[m.group(2)]
    return float(m.group(1)) * scale


def _dra_devices(s: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The devices the DRA kubelet plugin publishes on node `name` ([] where it does not run or sees no GPU)."""
    def make() -> list[dict[str, Any]]:
        n = s["nodes"][name]
        ds = _dra_plugin(s)
        if ds is None or not _ds_places(s, ds, name, n) or _ds_pull(s, ds, n):
            return []
        host = n["host"]
        if not _gpus_on(host):
            return []  # no driver, or NVML cannot load: the plugin publishes nothing
        spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
        lost = set((_read_json(_hp(host, "var_lib/gpuk8s-lab/state.json")).get("health") or {}).get("lost") or [])
        tmpl = _dra_template_device()
        model, mem = str(spec.get("gpu_model", "NVIDIA A100-SXM4-80GB")), int(spec.get("gpu_memory_mib", 81920))
        driver = _loaded_driver(host) or str(spec.get("driver") or "")
        out = []
        for i, profiles in _mig_devices(host).items():
            if i in lost:
                continue
            uuid_ = f"GPU-{host}-{i:04d}-lab"
            attrs = {**tmpl.get("attributes", {}), "productName": {"string": model}, "uuid": {"string": uuid_},
                     "driverVersion": {"version": ".".join(str(int(x)) for x in driver.split(".") if x.isdigit())},
                     "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + i:02x}:00.0"}}
            if profiles is None:
                out.append({**tmpl, "name": f"gpu-{i}", "attributes": {**attrs, "type": {"string": "gpu"}},
                            "capacity": {"memory": {"value": f"{mem}Mi"}}})
                continue
            for j, prof in enumerate(profiles):
                gib = re.search(r"(\d+)gb", prof)
                out.append({"name": f"gpu-{i}-mig-{j}", "attributes": {
                    **{k: v for k, v in attrs.items() if k != "uuid"}, "type": {"string": "mig"},
                    "profile": {"string": prof}, "parentUUID": {"string": uuid_},
                    "uuid": {"string": f"MIG-{host}-{i:04d}-{j:02d}-lab"}},
                    "capacity": {"memory": {"value": f"{int(gib.group(1)) * 1024 if gib else 0}Mi"}}})
        return out
    return _memo(("dra-devices", id(s), name), make)  # type: ignore[no-any-return]


def _dra_slices(s: dict[str, Any]) -> list[dict[str, Any]]:
    """`kubectl get resourceslices`: one slice per node the plugin publishes on, as the real driver names it."""
    out = []
    for name in s.get("nodes", {}):
        devices = _dra_devices(s, name)
        if not devices:
            continue
        prefix = f"{name}-{DRA_DRIVER}-"
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {
            "creationTimestamp": "2026-01-01T00:00:00Z", "generateName": prefix, "generation": 1,
            "name": prefix + _uid("slice", name)[:5],
            "ownerReferences": [{"apiVersion": "v1", "controller": True, "kind": "Node", "name": name,
                                 "uid": _uid("node", name)}],
            "resourceVersion": "1", "uid": _uid("slice", name)},
            "spec": {"devices": devices, "driver": DRA_DRIVER, "nodeName": name,
                     "pool": {"generation": 1, "name": name, "resourceSliceCount": 1}}})
    return out


def _cel_selects(expression: str, device: dict[str, Any]) -> bool:
    for term in expression.split("&&"):
        m = _DRA_TERM.match(term)
        if not m:
            return False  # beyond the lab's CEL: selects nothing
        if m.group("driver") is not None:
            if m.group("driver") != DRA_DRIVER:
                return False
        elif m.group("attr") is not None:
            a = device.get("attributes", {}).get(m.group("attr")) or {}
            if m.group("domain") != DRA_DRIVER or str(next(iter(a.values()), "")) != m.group("value"):
                return False
        else:
            have = _quantity_mib(str(device.get("capacity", {}).get("memory", {}).get("value", "")))
            want = _quantity_mib(m.group("qty"))
            cmp = (have > want) - (have < want)
            if not {">=": cmp >= 0, "<=": cmp <= 0, "==": cmp == 0, ">": cmp > 0, "<": cmp < 0}[m.group("op")]:
                return False
    return True


def _selectors(spec: dict[str, Any]) -> list[str]:
    return [str((sel.get("cel") or {}).get("expression", "")) for sel in spec.get("selectors") or []]


def _dra_requests(s: dict[str, Any], pod: dict[str, Any]) -> list[tuple[str, str, str, int, list[str]]] | None:
    """(claim, request, class, count, selectors) of every device the pod's claims ask for ([]: none); None where a
    claim's template or claim is missing (the pod waits for it)."""
    md, spec = pod.get("metadata", {}), pod.get("spec", {})
    ns = md.get("namespace", "default")
    out = []
    for pc in spec.get("resourceClaims") or []:
        if pc.get("resourceClaimTemplateName"):
            src = s.get("objects", {}).get(f"ResourceClaimTemplate/{ns}/{pc['resourceClaimTemplateName']}")
            body = ((src or {}).get("spec") or {}).get("spec") if src else None
        else:
            src = s.get("objects", {}).get(f"ResourceClaim/{ns}/{pc.get('resourceClaimName')}")
            body = (src or {}).get("spec") if src else None
        if body is None:
            return None
        for r in (body.get("devices") or {}).get("requests") or []:
            ex = r.get("exactly") or {}
            out.append((str(pc.get("name", "")), str(r.get("name", "")), str(ex.get("deviceClassName", "")),
                        int(ex.get("count", 1)), _selectors(ex)))
    if _minor(s) >= 37:  # KEP-5004: an extended resource a DeviceClass names, where the node's allocatable lacks it
        for res, count in _ext_requests(pod).items():
            cls = _extended_class(s, res)
            if cls:
                out.append(("extended-resources", f"container-0-request-{len(out)}", cls, count, ["extended:" + res]))
    return out


def _extended_class(s: dict[str, Any], resource: str) -> str:
    return next((o["metadata"]["name"] for o in _of_kind(s, "DeviceClass")
                 if (o.get("spec") or {}).get("extendedResourceName") == resource), "")


def _dra_needed(s: dict[str, Any], pod: dict[str, Any]) -> bool:
    spec = pod.get("spec", {})
    return bool(spec.get("resourceClaims")) or (_minor(s) >= 37 and any(
        _extended_class(s, r) for r in _ext_requests(pod)))


def _dra_fit(s: dict[str, Any], pod: dict[str, Any], node: str) -> list[list[str]] | None:
    """The [claim, request, device] the pod gets on the node ([]: it needs none there), None where its claims
    cannot be allocated there. A node whose allocatable has the extended resource serves it as before."""
    reqs = _dra_requests(s, pod)
    if reqs is None:
        return None
    n = node_json(s, node)
    reqs = [r for r in reqs if not (r[4][:1] and r[4][0].startswith("extended:")
                                    and int(n["status"]["allocatable"].get(r[4][0][9:], 0)) > 0)]
    if not reqs:
        return []
    taken = set(_placement(s).dra.get(node, ()))
    got: list[list[str]] = []
    for claim, request, cls, count, sels in reqs:
        dc = s.get("objects", {}).get(f"DeviceClass//{cls}")
        if dc is None:
            return None  # the class does not exist: kube-scheduler's "device class ... does not exist"
        wanted = _selectors(dc.get("spec") or {}) + [x for x in sels if not x.startswith("extended:")]
        free = [d["name"] for d in _dra_devices(s, node)
                if d["name"] not in taken and all(_cel_selects(e, d) for e in wanted)]
        if len(free) < count:
            return None
        for d in free[:count]:
            taken.add(d)
            got.append([claim, request, d])
    return got


def _cdi_enabled(host: str) -> bool:
    """Whether the host's containerd hands CDI devices to containers: 2.x unless enable_cdi is false (config v3:
    plugins."io.containerd.cri.v1.runtime"), 1.x only with enable_cdi = true (plugins."io.containerd.grpc.v1.cri")."""
    runtime = _host_facts(host)["runtime"]
    major = int(m.group(1)) if (m := re.match(r"containerd://v?(\d+)", runtime)) else 1
    enabled = major >= 2
    for d in _containerd_docs(host) or []:  # (a config containerd cannot read: it does not start at all)
        plugins = d.get("plugins") or {}
        for plugin in ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"):
            value = (plugins.get(plugin) or {}).get("enable_cdi")
            if isinstance(value, bool):
                enabled = value
    return enabled


def _dra_claims(s: dict[str, Any], ns: str | None) -> list[dict[str, Any]]:
    """`kubectl get resourceclaims`: those stored, and those the resource claim controller made for pods from
    templates (and, from 1.37, for extended resources), with their allocation while their pod holds it."""
    out = [o for o in _of_kind(s, "ResourceClaim") if ns is None or o["metadata"].get("namespace") == ns]
    for o in _of_kind(s, "Pod"):
        md = o.get("metadata", {})
        pns = md.get("namespace", "default")
        if (ns is not None and pns != ns) or not _dra_needed(s, o):
            continue
        st = _pod_status(s, o)
        held = st.get("dra") if st.get("phase") in ("Running", "Pending") and st.get("bound") else None
        names = [pc.get("name", "") for pc in o.get("spec", {}).get("resourceClaims") or []
                 if pc.get("resourceClaimTemplateName")] + (
            ["extended-resources"] if any(r[0] == "extended-resources" for r in _dra_requests(s, o) or []) else [])
        for cname in names:
            prefix = f"{md.get('name')}-{cname}-"
            claim: dict[str, Any] = {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {
                    "annotations": ({"resource.kubernetes.io/extended-resource-claim": "true"}
                                    if cname == "extended-resources"
                                    else {"resource.kubernetes.io/pod-claim-name": cname}),
                    "creationTimestamp": md.get("creationTimestamp", _now()), "generateName": prefix,
                    "name": prefix + _uid("claim", pns, str(md.get("name")), cname)[:5], "namespace": pns,
                    "ownerReferences": [{"apiVersion": "v1", "controller": True, "kind": "Pod",
                                         "name": md.get("name"), "uid": md.get("uid", "")}]},
                "spec": {"devices": {"requests": [
                    {"exactly": {"allocationMode": "ExactCount", "count": count, "deviceClassName": cls}, "name": req}
                    for c, req, cls, count, _sel in _dra_requests(s, o) or [] if c == cname]}}}
            mine = [x for x in held or [] if x[0] == cname]
            if mine:
                node = st["hostIP"]
                claim["status"] = {
                    "allocation": {"allocationTimestamp": md.get("creationTimestamp", _now()), "devices": {"results": [
                        {"device": d, "driver": DRA_DRIVER, "pool": node, "request": r} for _c, r, d in mine]},
                        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                    "reservedFor": [{"name": md.get("name"), "resource": "pods", "uid": md.get("uid", "")}]}
            out.append(claim)
    return out


def _pull_events(s: dict[str, Any], p: dict[str, Any]) -> list[dict[str, Any]]:
    """The kubelet's events for a pod whose image it cannot pull (pkg/kubelet/images/image_manager.go: reason
    Failed, 'Failed to pull image "%s": %v' with the runtime's gRPC error, as kubernetes-sigs/node-feature-discovery
    issue 1229 and NVIDIA/gpu-operator issue 273 show them; then BackOff 'Back-off pulling image "%s"')."""
    node = p.get("spec", {}).get("nodeName") or p.get("status", {}).get("hostIP")
    st = p.get("status", {})
    waiting = [(kind, c) for kind in ("initContainers", "containers")
               for c in st.get("initContainerStatuses" if kind == "initContainers" else "containerStatuses", [])
               if (c.get("state", {}).get("waiting") or {}).get("reason") == "ImagePullBackOff"]
    if not waiting or node not in s.get("nodes", {}):
        return []
    n = s["nodes"][node]
    owner = next((o["name"] for o in p["metadata"].get("ownerReferences", []) if o.get("kind") == "DaemonSet"), None)
    ds = next((d for d in _daemonsets(s) if d["metadata"]["name"] == owner), None) if owner else None
    pulled = _ds_pull(s, ds, n) if ds is not None else pod_pull_error(n["host"], p.get("spec", {}))
    if not pulled:
        return []
    image, error = pulled
    code = "NotFound" if error.endswith(": not found") else "Unknown"
    md = p["metadata"]
    ns = md.get("namespace", "default")
    kind, c = waiting[0]
    base = {"apiVersion": "v1", "kind": "Event", "involvedObject": {"kind": "Pod", "namespace": ns, "name": md["name"],
                                                                    "fieldPath": f"spec.{kind}{{{c['name']}}}"},
            "count": 3, "source": {"component": "kubelet", "host": node}, "reportingComponent": "kubelet"}
    h = hashlib.sha1(md["name"].encode()).hexdigest()
    return [{**base, "metadata": {"name": f"{md['name']}.{h[:16]}", "namespace": ns}, "reason": "Failed",
             "type": "Warning", "message": f'Failed to pull image "{image}": rpc error: code = {code} desc = {error}'},
            {**base, "metadata": {"name": f"{md['name']}.{h[16:32]}", "namespace": ns}, "reason": "BackOff",
             "type": "Normal", "message": f'Back-off pulling image "{image}"'}]


def _sandbox_events(s: dict[str, Any], p: dict[str, Any]) -> list[dict[str, Any]]:
    """The kubelet's FailedCreatePodSandBox event of a pod stuck in ContainerCreating (sandbox_refused)."""
    node = p.get("spec", {}).get("nodeName") or p.get("status", {}).get("hostIP")
    if node not in s.get("nodes", {}):
        return []
    message = sandbox_refused(s["nodes"][node]["host"], p.get("spec", {}))
    if message is None:
        return []
    md = p["metadata"]
    ns = md.get("namespace", "default")
    h = hashlib.sha1(("sandbox/" + md["name"]).encode()).hexdigest()
    return [{"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{md['name']}.{h[:16]}", "namespace": ns},
             "involvedObject": {"kind": "Pod", "namespace": ns, "name": md["name"]}, "reason": "FailedCreatePodSandBox",
             "type": "Warning", "count": 5, "message": message, "source": {"component": "kubelet", "host": node},
             "reportingComponent": "kubelet"}]


def _events(s: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in _pods(s):
        out += _pull_events(s, p) + _sandbox_events(s, p)
        cond = next((c for c in p.get("status", {}).get("conditions", []) if c.get("reason") == "Unschedulable"),
                    None)
        if cond is None or p.get("spec", {}).get("nodeName"):
            continue
        md = p["metadata"]
        ns = md.get("namespace", "default")
        out.append({"apiVersion": "v1", "kind": "Event",
                    "metadata": {"name": f"{md['name']}.{hashlib.sha1(md['name'].encode()).hexdigest()[:16]}",
                                 "namespace": ns},
                    "involvedObject": {"kind": "Pod", "namespace": ns, "name": md["name"]},
                    "reason": "FailedScheduling", "type": "Warning", "count": 1, "message": cond["message"],
                    "source": {"component": "default-scheduler"}, "reportingComponent": "default-scheduler"})
    return out


def _plugin_log(s: dict[str, Any], node: str) -> str:
    n = s["nodes"][node]
    ts = "I1130 09:00:00.000000       1"
    if _gpus_on(n["host"]) and not _plugin_gpus(s, node, n):
        e = "E1130 09:00:00.000300       1"
        return (f"{ts} main.go:356] Retrieving plugins.\n"
                f"{ts} factory.go:104] Detected non-NVML platform: could not load NVML library: libnvidia-ml.so.1: "
                "cannot open shared object file: No such file or directory\n"
                f"{ts} factory.go:104] Detected non-Tegra platform: /sys/devices/soc0/family file not found\n"
                f"{e} factory.go:112] Incompatible platform detected\n"
                f"{e} factory.go:113] If this is a GPU node, did you configure the NVIDIA Container Toolkit?\n"
                f"{e} factory.go:114] You can check the prerequisites at: "
                "https://github.com/NVIDIA/k8s-device-plugin#prerequisites\n"
                f"{e} factory.go:115] You can learn how to set the runtime at: "
                "https://github.com/NVIDIA/k8s-device-plugin#quick-start\n"
                f"{e} factory.go:116] If this is not a GPU node, you should set up a toleration or nodeSelector to "
                "only deploy this plugin on GPU nodes\n"
                f"{ts} main.go:386] No devices found. Waiting indefinitely.\n")
    p = _plugin_on_node(s, node, n)
    if p.get("error"):
        return f"E1130 09:00:00.000100       1 main.go:173] {p['error']}\n"
    res = p.get("resource", "nvidia.com/gpu")
    text = (f"{ts} main.go:356] Retrieving plugins.\n"
            f"{ts} server.go:195] Starting GRPC server for '{res}'\n"
            f"{ts} server.go:139] Starting to serve '{res}' on /var/lib/kubelet/device-plugins/{plugin_socket(res)}\n")
    if not (_host_dir(n["host"]) / DEVICE_PLUGINS / "kubelet.sock").exists():
        # its Register dials kubelet.sock (NVIDIA/k8s-device-plugin issue 82 quotes the lines)
        return text + (f"{ts} server.go:146] Could not register device plugin: context deadline exceeded\n"
                       f"{ts} main.go:253] Could not contact Kubelet. Did you enable the device plugin feature gate?\n")
    text += f"{ts} server.go:146] Registered device plugin for '{res}' with Kubelet\n"
    for gpu, xid in sorted(_xid_sick(n["host"]).items()):
        # the lines of v0.15-v0.17 (akash-network/support#244 quotes health.go:185 and server.go:292)
        uid = f"GPU-{n['host']}-{gpu:04d}-lab"
        text += (f"I1130 09:10:00.000000       1 health.go:185] XidCriticalError: Xid={xid} on Device={uid}; "
                 "marking device as unhealthy.\n"
                 f"I1130 09:10:00.000100       1 server.go:292] '{res}' device marked unhealthy: {uid}\n")
    return text


def _doctor_kubectl(verb: str, words: list[str], args: list[str]) -> int | None:
    """The logs of a device plugin pod (kubectl get events: _get); None: not for this part of the fake."""
    if verb == "logs" and len(words) >= 2:
        s = read_state()
        # a test's override: what a workload itself prints (an application's log cannot be derived), for a pod
        # annotated lab.gpuk8s.io/log once it is bound to a node
        mine = s.get("objects", {}).get(f"Pod/{_flag(args, '-n') or 'default'}/{words[1]}")
        text = ((mine or {}).get("metadata", {}).get("annotations") or {}).get("lab.gpuk8s.io/log")
        if mine is not None and text is not None and (mine.get("spec", {}).get("nodeName")
                                                     or _pod_status(s, mine).get("bound")):
            out(text)
            return 0
        ran = fabric_log(s, mine) if mine is not None and _pod_status(s, mine).get("phase") in (
            "Running", "Succeeded", "Failed") else None
        if ran is not None:
            out(ran)
            return 0
        plugin = _device_plugin(s)
        if plugin is None:
            return None
        for name, n in s.get("nodes", {}).items():
            if words[1] == f"{plugin['metadata']['name']}-{name}" and _runs_on(plugin, _node_labels(name, n)):
                if _ds_pull(s, plugin, n):  # the API server's answer for a container that never started
                    why = ("PodInitializing" if _pod_spec(plugin).get("initContainers")
                           else "trying and failing to pull image")
                    err(f'Error from server (BadRequest): container "nvidia-device-plugin-ctr" in pod "{words[1]}" '
                        f"is waiting to start: {why}\n")
                    return 1
                out(_plugin_log(s, name))
                return 0
    return None


# -- the RDMA fabric (issue 43, docs/fabric.md) --------------------------------------------------------------------
# What decides (so that the lab proves gpuk8s's manifests and judgements, not itself):
# - NVIDIA's RDMA shared device plugin (a DaemonSet whose image is k8s-rdma-shared-dev-plugin) registers, on each node
#   where its pod lands (affinity, the image pulled) and the host has RDMA devices (the lab's sysfs files, all
#   Mellanox: vendor 15b3), the resource its ConfigMap rdma-devices names (resourcePrefix/resourceName, default
#   prefix rdma) with rdmaHcaMax as capacity (pkg/resources/resources_manager.go, README);
# - a pod running nccl-tests' all_reduce_perf (-b -e -f -g) succeeds where the scheduler's filters pass, and its log
#   is the tool's table (the header, rows and footer of tests/fixtures/real/fabric/nccl's texts) with bus bandwidths
#   the lab models from the host's GPUs: the published large-size figure of 8 x H100/H200 or A100 with NVSwitches,
#   else a PCIe-class figure, times the host's fabric.json "nccl" factor (a test's NVLink fault), rising with size;
# - perftest's ib_write_bw: a server pod (no address argument) runs until a client pod names its node's address and
#   port, a client succeeds where such a server runs; the client's log is perftest's (src/perftest_parameters.c's
#   header, RESULT_FMT_G and REPORT_FMT; -D prints peak 0.00) with the average at 97% of the slower port's rate times
#   each port's fabric.json "throughput" factor (a link with errors: its rate still reads full in sysfs); a port not
#   Active fails as perftest's check_link does (" Port number 1 state is Down", then " Couldn't get context for the
#   device", src/perftest_parameters.c and write_bw.c).
# - NCCL across nodes (phases/fabric_nccl.py): a worker pod running sshd (Running while it exists, its Secret mounted;
#   ContainerCreating while the Secret is missing, as the kubelet waits for a volume) and a launcher running mpirun
#   -H IP:SLOTS,... : it succeeds where each address is a node whose worker runs sshd on that address and on the
#   port plm_rsh_args names, from the same Secret; its log is all_reduce_perf's across both nodes (a "Rank N ... on
#   NODE" line per rank) with bus bandwidths at the least of each node's GPUs alone (as above) and its NICs: every
#   active port of NCCL_IB_HCA at the slowest one's rate times its throughput factor (NCCL spreads its channels over
#   the NICs: the slowest holds its share back), at 98% of 0.12 GB/s per Gb/s (nccl-tests issue 119).
FABRIC_TOOLS = ("all_reduce_perf", "ib_write_bw", "mpirun", "sshd")
# all_reduce_perf's table header, as tests/fixtures/real/fabric/nccl/allreduce-h100-8gpu-single-node-nvls-nccl-tests-290
# prints it
NCCL_HEADER = [
    "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw "
    "#wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]


# what Open MPI's mpirun (ORTE) prints after ssh's own line when it cannot start a daemon on a host: its help message
# [failed-daemon-launch] (tests/fixtures/real/fabric/mpi/mpirun-ssh-refused-orte-failed-daemon-launch.txt, from
# Open MPI's orte/mca/errmgr/base/help-errmgr-base.txt), between its 74-dash lines
ORTE_TEXT = (Path(__file__).resolve().parents[2] / "fixtures" / "real" / "fabric" / "mpi" /
             "mpirun-ssh-refused-orte-failed-daemon-launch.txt")


def _rdma_ports(host: str) -> dict[tuple[str, int], dict[str, str]]:
    root = Path(_hp(host, "var_lib/gpuk8s-lab/rdma"))
    out: dict[tuple[str, int], dict[str, str]] = {}
    if not root.is_dir():
        return out
    for dev in sorted(root.iterdir()):
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []:
            out[(dev.name, int(port.name))] = {f.name: f.read_text().strip() for f in port.iterdir() if f.is_file()}
    return out


def _fabric_model(host: str) -> dict[str, Any]:
    p = Path(_hp(host, "var_lib/gpuk8s-lab/fabric.json"))
    return json.loads(p.read_text()) if p.exists() else {}


def _rdma_plugin(s: dict[str, Any]) -> dict[str, Any] | None:
    return next((ds for ds in _daemonsets(s) for c in _pod_spec(ds).get("containers", [])
                 if "k8s-rdma-shared-dev-plugin" in str(c.get("image", ""))), None)


def _rdma_resource(s: dict[str, Any]) -> tuple[str, int] | None:
    cm = s.get("objects", {}).get("ConfigMap/kube-system/rdma-devices")
    try:
        conf = json.loads(((cm or {}).get("data") or {}).get("config.json", ""))
        first = conf["configList"][0]
        return f"{first.get('resourcePrefix') or 'rdma'}/{first['resourceName']}", int(first["rdmaHcaMax"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None  # the plugin exits: "error reading config file" (no resource registered)


def rdma_capacity(s: dict[str, Any], name: str, n: dict[str, Any]) -> dict[str, str]:
    ds = _rdma_plugin(s)
    res = _rdma_resource(s) if ds is not None else None
    if ds is None or res is None or not _runs_on(ds, _node_labels(name, n)) or _ds_pull(s, ds, n):
        return {}
    return {res[0]: str(res[1])} if _rdma_ports(n["host"]) else {}


def _tool(pod: dict[str, Any]) -> tuple[str, list[str]] | None:
    cs = pod.get("spec", {}).get("containers") or [{}]
    cmd = [str(x) for x in (cs[0].get("command") or [])]
    if cmd[:2] == ["sh", "-c"] and len(cmd) > 3 and cmd[2] == 'exec "$(command -v mpirun)" "$@"':
        cmd = ["mpirun", *cmd[4:]]  # sh -c 'exec "$(command -v mpirun)" "$@"' mpirun ARGS: $0, then ARGS
    elif cmd[:2] == ["sh", "-c"] and len(cmd) > 2 and "exec " in cmd[2]:  # sh -c '... && exec TOOL ARGS'
        cmd = shlex.split(cmd[2].split("exec ", 1)[1])
    tool = cmd[0].rsplit("/", 1)[-1] if cmd else ""
    return (tool, cmd[1:]) if tool in FABRIC_TOOLS else None


def _opt(args: list[str], flag: str, default: str = "") -> str:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else default


def _perftest_peer(args: list[str]) -> str | None:
    """A client's server address: its last argument when that is not an option's value."""
    if not args or args[-1].startswith("-"):
        return None
    valued = {"-d", "-i", "-p", "-q", "-D", "-x", "-s", "-n"}
    return None if len(args) > 1 and args[-2] in valued else args[-1]


def _node_by_ip(s: dict[str, Any], ip: str) -> str | None:
    return next((name for name, n in s.get("nodes", {}).items() if _host_facts(n["host"]).get("address") == ip), None)


def _stored_fabric_pods(s: dict[str, Any]) -> list[tuple[dict[str, Any], str, list[str]]]:
    out = []
    for key, o in s.get("objects", {}).items():
        t = _tool(o) if key.startswith("Pod/") else None
        if t is not None:
            out.append((o, t[0], t[1]))
    return out


def _server_for(s: dict[str, Any], args: list[str]) -> dict[str, Any] | None:
    node = _node_by_ip(s, _perftest_peer(args) or "")
    return next((o for o, tool, a in _stored_fabric_pods(s) if tool == "ib_write_bw" and _perftest_peer(a) is None
                 and _pinned_node(o) == node and _opt(a, "-p", "18515") == _opt(args, "-p", "18515")), None)


def fabric_pod_status(s: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any] | None:
    """The status of a fabric test pod; None: not one."""
    t = _tool(pod)
    if t is None:
        return None
    tool, args = t
    node = _pinned_node(pod)
    if node not in s.get("nodes", {}):
        return {"phase": "Pending"}
    n = node_json(s, node)
    why = _filter(s, pod, node, n) if n["status"]["conditions"][0]["status"] == "True" else ["node(s) not ready"]
    if why:
        return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                    "reason": "Unschedulable", "message": _fit_error(s, {node: why})}]}
    if tool in ("sshd", "mpirun") and _secret_of(s, pod) is None:  # the kubelet waits for the Secret volume
        return {**creating(pod.get("spec", {})), "hostIP": node, "bound": True}
    started = _start(s, pod, node)
    if started.get("phase") != "Succeeded" or tool == "all_reduce_perf":
        return started
    if tool == "sshd":
        return {**started, "phase": "Running"}
    if tool == "mpirun":
        return {**started, "phase": "Succeeded" if _mpirun(s, args)[1] else "Failed"}
    if _perftest_peer(args) is None:  # a server: until its client comes
        ip = _host_facts(s["nodes"][node]["host"]).get("address")
        client = any(tool2 == "ib_write_bw" and _perftest_peer(a) == ip and _opt(a, "-p", "18515") ==
                     _opt(args, "-p", "18515") for _, tool2, a in _stored_fabric_pods(s))
        return {**started, "phase": "Succeeded" if client else "Running"}
    text, ok = _perftest_client(s, pod, node, args)
    return {**started, "phase": "Succeeded" if ok else "Failed"}


def _nccl_peak(spec: dict[str, Any], gpus: int) -> float:
    model = str(spec.get("gpu_model", ""))
    if gpus == 8 and int(spec.get("nvswitches", 0)) and re.search(r"H100|H200", model):
        return 476.53  # nccl-tests issue 290's 8 x H100 at 4 GiB
    if gpus == 8 and int(spec.get("nvswitches", 0)) and "A100" in model:
        return 231.72  # facebookresearch/gcm's 8 x A100 at 1 GiB
    return 21.0 if gpus > 1 else 0.0  # GPUs over PCIe, no NVLink: the lab's model


def _nccl_log(s: dict[str, Any], node: str, args: list[str]) -> str:
    host = s["nodes"][node]["host"]
    spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
    g = int(_opt(args, "-g", "1"))
    lo, hi, f = int(_opt(args, "-b", "33554432")), int(_opt(args, "-e", "33554432")), int(_opt(args, "-f", "2"))
    peak = _nccl_peak(spec, g) * float(_fabric_model(host).get("nccl", 1.0))
    model = str(spec.get("gpu_model", "NVIDIA A100-SXM4-80GB"))
    out = [f"# nThread 1 nGpus {g} minBytes {lo} maxBytes {hi} step: {f}(factor) warmup iters: 1 iters: 20 agg iters: "
           "1 validation: 1 graph: 0", "#", "# Using devices"]
    out += [f"#  Rank {i:2d} Group  0 Pid      1 on {node:>10} device {i:2d} [0x{0x18 + i:02x}] {model}"
            for i in range(g)]
    return _nccl_rows(out, peak, lo, hi, f, g)


def _nccl_rows(out: list[str], peak: float, lo: int, hi: int, f: int, g: int) -> str:
    """The table after a header (`out`), g ranks: bus bandwidth rising with size to `peak`, as the texts show."""
    out += ["#", *NCCL_HEADER]
    size, total, rows = lo, 0.0, 0
    while size <= hi and rows < 64:
        bus = peak * size / (size + (32 << 20))
        alg = bus * g / (2 * (g - 1)) if g > 1 else 0.0
        t = size / (alg * 1e3) if alg else 0.0
        out.append(f"{size:12d}  {size // 4:12d}     float     sum      -1  {t:7.1f}  {alg:6.2f}  {bus:6.2f}  {0:5d}  "
                   f"{t:7.1f}  {alg:6.2f}  {bus:6.2f}  {0:5d}")
        total, rows, size = total + bus, rows + 1, size * f
    out += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {total / max(rows, 1):.3f}", "#", ""]
    return "\n".join(out)


def _perftest_client(s: dict[str, Any], pod: dict[str, Any], node: str, args: list[str]) -> tuple[str, bool]:
    """The client's log, and whether it succeeded."""
    host = s["nodes"][node]["host"]
    dev, port = _opt(args, "-d", "mlx5_0"), int(_opt(args, "-i", "1"))
    mine = _rdma_ports(host).get((dev, port))
    if mine is None:
        return f" Couldn't find IB device {dev}\n", False  # src/perftest_resources.c ctx_find_dev's words
    if not mine.get("state", "").startswith("4"):
        state = {"1": "Down", "2": "Init", "3": "Armed"}.get(mine.get("state", "1")[:1], "Down")
        return f" Port number {port} state is {state}\n Couldn't get context for the device\n", False
    server = _server_for(s, args)
    peer = _node_by_ip(s, _perftest_peer(args) or "")
    if server is None or peer is None:
        return f"Couldn't connect to {_perftest_peer(args)}:{_opt(args, '-p', '18515')}\n", False
    srv_args = (_tool(server) or ("", []))[1]
    theirs = _rdma_ports(s["nodes"][peer]["host"]).get((_opt(srv_args, "-d", "mlx5_0"), int(_opt(srv_args, "-i", "1"))))
    if theirs is None or not theirs.get("state", "").startswith("4"):
        return f"Couldn't connect to {_perftest_peer(args)}:{_opt(args, '-p', '18515')}\n", False

    def rate(p: dict[str, str]) -> float:
        m = re.match(r"([0-9.]+)", p.get("rate", "0"))
        return float(m.group(1)) if m else 0.0

    def factor(h: str, d: str, pt: int) -> float:
        return float((_fabric_model(h).get("throughput") or {}).get(f"{d}/{pt}", 1.0))

    bw = min(rate(mine), rate(theirs)) * 0.97 * factor(host, dev, port) * factor(
        s["nodes"][peer]["host"], _opt(srv_args, "-d", "mlx5_0"), int(_opt(srv_args, "-i", "1")))
    secs = int(_opt(args, "-D", "5"))
    iters = int(bw * 125000000 / 65536 * secs)
    line = "-" * 87
    ib = mine.get("link_layer") == "InfiniBand"
    text = "\n".join([
        line, "                    RDMA_Write BW Test",
        f" Dual-port       : OFF\t\tDevice         : {dev}",
        f" Number of qps   : {_opt(args, '-q', '1')}\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF", " PCIe relax order: ON", " TX depth        : 128",
        " CQ Moderation   : 1", " CQE Poll Batch  : 16", " Mtu             : 4096[B]",
        f" Link type       : {'IB' if ib else 'Ethernet'}", " Max inline data : 0[B]", " rdma_cm QPs\t : OFF",
        " Data ex. method : Ethernet", line,
        " local address: LID 0x2a QPN 0x0093 PSN 0xbf9bfe RKey 0x1fcfcd VAddr 0x007f0f0fcee000",
        " remote address: LID 0x2b QPN 0x0093 PSN 0x62655e RKey 0x1fcfcd VAddr 0x007f6d6ba53000", line,
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
        f" {65536:<7d}    {iters:<10d}       {0.0:<7.2f}            {bw:<7.2f}\t\t     "
        f"{bw * 125000000 / 65536 / 1e6:<7.6f}",
        line, ""])
    return text, True


def _secret_of(s: dict[str, Any], pod: dict[str, Any]) -> dict[str, str] | None:
    """The files (decoded) of the Secret a pod's volume names, as the kubelet projects them (only the keys its
    `items` list, where it lists any); None: no such volume or Secret."""
    ns = pod.get("metadata", {}).get("namespace", "default")
    for v in pod.get("spec", {}).get("volumes") or []:
        name = (v.get("secret") or {}).get("secretName")
        obj = s.get("objects", {}).get(f"Secret/{ns}/{name}") if name else None
        if obj is not None:
            data = {k: base64.b64decode(str(x)).decode(errors="replace") for k, x in (obj.get("data") or {}).items()}
            items = (v.get("secret") or {}).get("items")
            if isinstance(items, list):
                data = {str(i.get("path")): data[i.get("key")] for i in items
                        if isinstance(i, dict) and i.get("key") in data}
            return data
    return None


def _sshd_at(s: dict[str, Any], ip: str) -> tuple[str, dict[str, Any], int] | None:
    """The Running sshd worker listening on an address: its node, its pod, its port (its sshd_config's)."""
    node = _node_by_ip(s, ip)
    for o, tool, a in _stored_fabric_pods(s):
        if tool != "sshd" or _pinned_node(o) != node or f"ListenAddress={ip}" not in a:
            continue
        conf = _secret_of(s, o) or {}
        m = re.search(r"^Port (\d+)$", conf.get("sshd_config", ""), re.M)
        if node is not None and _pod_status(s, o).get("phase") == "Running":
            return node, o, int(m.group(1)) if m else 22
    return None


def _mpirun(s: dict[str, Any], args: list[str]) -> tuple[str, bool]:
    """What a launcher's mpirun prints, and whether it succeeded."""
    hosts = [h.rsplit(":", 1) for h in _opt(args, "-H").split(",") if h]
    rsh = _opt(args, "plm_rsh_args")
    port = int(_opt(rsh.split(), "-p", "22"))
    placed: list[tuple[str, int]] = []
    for ip, slots in hosts:
        at = _sshd_at(s, ip)
        if at is None or at[2] != port:  # OpenSSH's sshconnect.c words, then Open MPI's (orte/mca/plm/rsh)
            return (f"ssh: connect to host {ip} port {port}: Connection refused\n"
                    + ORTE_TEXT.read_text().split("\n", 1)[1]), False
        placed.append((at[0], int(slots)))
    env = dict(x.split("=", 1) for x in (args[i + 1] for i, a in enumerate(args) if a == "-x") if "=" in x)
    hcas = [h.split(":") for h in env.get("NCCL_IB_HCA", "").lstrip("=").split(",") if h]
    bounds = []
    for node, g in placed:
        host = s["nodes"][node]["host"]
        spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
        bounds.append(_nccl_peak(spec, g) * float(_fabric_model(host).get("nccl", 1.0)))
        ports = _rdma_ports(host)
        eff = [_rate(p) * float((_fabric_model(host).get("throughput") or {}).get(f"{d}/{pt}", 1.0))
               for (d, pt), p in ports.items() if p.get("state", "").startswith("4")
               and (not hcas or [d, str(pt)] in hcas)]
        bounds.append(len(eff) * min(eff) * 0.12 * 0.98 if eff else 1.1)  # no IB: NCCL's sockets
    first = _read_json(_hp(s["nodes"][placed[0][0]]["host"], "var_lib/gpuk8s-lab/host.json"))
    info = env.get("NCCL_DEBUG", "").upper() == "INFO"
    lo, hi, f = int(_opt(args, "-b", "33554432")), int(_opt(args, "-e", "33554432")), int(_opt(args, "-f", "2"))
    out = [f"# nThread 1 nGpus 1 minBytes {lo} maxBytes {hi} step: {f}(factor) warmup iters: 1 iters: 20 agg iters: "
           "1 validation: 1 graph: 0", "#", "# Using devices"]
    rank = 0
    for node, g in placed:
        for i in range(g):
            out.append(f"#  Rank {rank:2d} Group  0 Pid  {1000 + rank:5d} on {node:>10} device {i:2d} "
                       f"[0000:{0x18 + i:02x}:00] {first.get('gpu_model', 'NVIDIA A100-SXM4-80GB')}")
            rank += 1
    if info:  # NCCL's connection lines across the nodes, as its src/transport/net.cc prints them (NCCL 2.18.3+)
        out += _nccl_channels(s, placed, hcas)
    return _nccl_rows(out, min(bounds), lo, hi, f, rank), True


def _gdr(host: str) -> bool:
    """Whether NCCL gets GPUDirect RDMA on the host: the open modules on Linux 5.12+ (dma-buf), or nvidia_peermem
    loaded (the lab's state)."""
    try:
        state = _read_json(_hp(host, "var_lib/gpuk8s-lab/state.json"))
    except (OSError, ValueError):
        state = {}
    spec = _read_json(_hp(host, "var_lib/gpuk8s-lab/host.json"))
    kernel = tuple(int(x) for x in re.findall(r"\d+", str(spec.get("kernel") or "5.15"))[:2])
    return ((state.get("driver") or {}).get("flavor") == "open" and kernel >= (5, 12)) or \
        "nvidia_peermem" in (state.get("modules") or [])


def _nccl_channels(s: dict[str, Any], placed: list[tuple[str, int]], hcas: list[list[str]]) -> list[str]:
    """Each GPU's ring connection to the other node, sent and received, over the NIC of its channel: /GDRDMA where
    both hosts have GPUDirect RDMA."""
    gdr = all(_gdr(s["nodes"][n]["host"]) for n, _ in placed)
    nics = max(len(hcas), 1)
    out, base = [], 0
    starts = []
    for _, g in placed:
        starts.append(base)
        base += g
    for i, (node, g) in enumerate(placed):
        other = (i + 1) % len(placed)
        for d in range(g):
            src, dst = starts[i] + d, starts[other] + d
            for kind, a, b in (("send", src, dst), ("receive", dst, src)):
                out.append(f"{node}:{1000 + src}:{2000 + src} [{d}] NCCL INFO Channel {d:02d}/0 : {a}[{d}] -> {b}[{d}] "
                           f"[{kind}] via NET/IB/{d % nics}{'/GDRDMA' if gdr else ''}")
    return out


def _rate(p: dict[str, str]) -> float:
    m = re.match(r"([0-9.]+)", p.get("rate", "0"))
    return float(m.group(1)) if m else 0.0


def fabric_log(s: dict[str, Any], pod: dict[str, Any]) -> str | None:
    """What `kubectl logs` prints of a fabric test pod that ran; None: not one (or not run)."""
    t = _tool(pod)
    node = _pinned_node(pod)
    if t is None or node not in s.get("nodes", {}):
        return None
    tool, args = t
    if tool == "all_reduce_perf":
        return _nccl_log(s, node, args)
    if tool == "mpirun":
        return _mpirun(s, args)[0]
    if tool == "sshd":
        return f"Server listening on {_opt(args, '-o')[len('ListenAddress='):]} port 18514.\n"
    if _perftest_peer(args) is None:
        return ("\n************************************\n* Waiting for client to connect... *\n"
                "************************************\n")
    return _perftest_client(s, pod, node, args)[0]
