"""The Kubernetes client seam: one small interface, kubectl behind it, over SSH or with a local kubeconfig.

Phases, verify and (later) status and doctor talk to the cluster only through `KubeClient`. Two real
implementations: `SSHKubectl` runs kubectl with the admin kubeconfig on a control plane (the default: the
user needs no local kubectl), `LocalKubectl` runs the operator's kubectl with a kubeconfig file. Both build
the same argv; values are quoted for the remote shell, never interpolated. Unit tests use a fake.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuk8s.errors import GpuK8sError
from gpuk8s.kube import state
from gpuk8s.kube.state import StateError, is_node_name
from gpuk8s.lines import lines_that_matter
from gpuk8s.remote import Session
from gpuk8s.text import clean

ADMIN = "/etc/kubernetes/admin.conf"
# What gpuk8s reads of one kubectl command. kubectl's lists hold whole objects: a real pod is several KB and a
# GPU node tens of KB (status.images), so a cluster of a few hundred pods is past the 1 MiB other commands are
# cut at; 5,000 pods and 512 nodes of real size are ~30 MB. A read over the cap is an error naming its size,
# never a list with objects missing.
READ_CAP = 128 << 20
# What is read of text a tenant or a node writes (a pod's log, a /metrics body through the API server's proxy):
# far less than a list of objects, so that a huge answer costs nothing to refuse
LOG_CAP = 1 << 20
RAW_CAP = 16 << 20


# kubectl's answer for a kind the API server does not serve (k8s.io/cli-runtime resource builder, on a no-match
# error: `the server doesn't have a resource type %q`; kubernetes/kubernetes PR 64493, kubernetes/kubectl issue 781)
NOT_SERVED = "the server doesn't have a resource type"


class KubeError(GpuK8sError):
    """kubectl failed or printed something unreadable; the message is safe to show (masked, cleaned)."""

    kind = "kube"


@dataclass(frozen=True)
class Output:
    ok: bool
    stdout: str
    stderr: str
    truncated: bool = False  # kubectl printed more than the read's cap on stdout: stdout is not all of it
    size: int = 0  # bytes kubectl printed on stdout in all

    def tail(self, n: int = 8) -> str:
        return " | ".join(lines_that_matter(self.stderr + "\n" + self.stdout, n))


# (kind, name, namespace) of one object; kubectl ignores the namespace of a cluster-scoped kind, and None is
# kubectl without -n
ObjectRef = tuple[str, str, str | None]


class KubeClient(Protocol):
    """What gpuk8s asks of a cluster. Every method raises KubeError when kubectl fails."""

    where: str  # for messages: "kubectl on cp-1" or "kubectl with ./lab.kubeconfig"

    def get(self, kind: str, name: str | None = None, namespace: str | None = None,
            field_selector: str | None = None) -> list[dict[str, Any]]:
        """Objects of `kind`: in namespace `namespace`, in every namespace with '*' (-A), and with None as
        kubectl without -n does (the kubeconfig context's namespace, `default`; cluster-scoped kinds are
        unaffected); with `name`, the one object or [] when it does not exist. `field_selector`: only the
        objects the API server selects (`spec.nodeName=N`, `status.phase!=Succeeded`; the fields each kind
        supports), so that a read at scale carries only what is needed."""
        ...

    def get_refs(self, refs: Sequence[ObjectRef]) -> dict[ObjectRef, dict[str, Any]]:
        """The objects `refs` name that exist, by their ref: one kubectl call per namespace, not one per
        object (`kubectl get KIND/NAME ... --ignore-not-found`). Where a batch fails (a kind the cluster does
        not serve fails the whole call) its objects are read one by one: one of a kind the API server does not
        serve is not there; any other failure to read one is a KubeError (never taken for absent)."""
        ...

    def apply(self, text: str) -> str:
        ...

    def label(self, node: str, labels: dict[str, str | None]) -> None:
        """Set labels; a value None removes the label."""
        ...

    def taint(self, node: str, taints: list[str]) -> None:
        ...

    def delete(self, kind: str, names: list[str], namespace: str) -> None:
        ...

    def logs(self, pod: str, namespace: str, tail: int = 50) -> str:
        ...

    def events(self, namespace: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        """Events in `namespace` (every namespace with None), only those `field_selector` selects
        (`type=Warning,involvedObject.kind=Pod`: an event list is the largest read of a busy cluster)."""
        ...

    def raw_get(self, path: str, cap: int = RAW_CAP) -> str:
        """`kubectl get --raw PATH`: an API server path, e.g. a pod's proxy
        /api/v1/namespaces/NS/pods/POD:9400/proxy/metrics; the body as text. A body over `cap` bytes is a
        KubeError naming its size."""
        ...

    def drain(self, node: str, timeout_s: int) -> str:
        """Cordon the node and evict its pods (DaemonSets' ignored, emptyDir data deleted), respecting
        PodDisruptionBudgets, within timeout_s; kubectl's output. Raises KubeError when it cannot."""
        ...

    def delete_node(self, node: str) -> None:
        """Delete the Node object (no error when it is gone already)."""
        ...

    def uncordon(self, node: str) -> None:
        """Make the node schedulable again (after a drain)."""
        ...

    def cordon(self, node: str) -> None:
        """Mark the node unschedulable: no new pod lands on it."""
        ...


# Pods that hold nothing any more (their resources are free again): what status and verify leave out of their reads
NOT_DONE = "status.phase!=Succeeded,status.phase!=Failed"


def on_node(node: str) -> str:
    """The field selector of the pods bound to one node, less those that are done. A name that no Node can have
    (a ',' would add a term of its own) is refused."""
    if not is_node_name(node):
        raise ValueError(f"not a node name: {node!r}")
    return f"spec.nodeName={node},{NOT_DONE}"


def drain_args(node: str, timeout_s: int) -> list[str]:
    return ["drain", node, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout_s}s"]


def label_args(node: str, labels: dict[str, str | None] | dict[str, str]) -> list[str]:
    """kubectl label's argv; a value None removes the label (`key-`)."""
    return ["label", "node", node, *(f"{k}-" if v is None else f"{k}={v}" for k, v in sorted(labels.items())),
            "--overwrite"]


def taint_args(node: str, taints: list[str]) -> list[str]:
    return ["taint", "node", node, *taints, "--overwrite"]


class Kubectl:
    """The KubeClient methods as kubectl argv; subclasses say where kubectl runs (`_kubectl`)."""

    where = "kubectl"

    def _kubectl(self, args: list[str], stdin: str | None = None, timeout: float | None = None,
                 cap: int | None = None) -> Output:
        """kubectl ARGS; `timeout`: seconds it may take where kubectl has its own, longer bound (drain).
        At most `cap` bytes of stdout are kept (Output.truncated says when more came)."""
        raise NotImplementedError

    def _run(self, args: list[str], stdin: str | None = None, timeout: float | None = None,
             cap: int | None = None) -> Output:
        """_kubectl, where an output cut at `cap` (default READ_CAP) is an error naming its size: never half a
        list."""
        cap = READ_CAP if cap is None else cap
        out = self._kubectl(args, stdin, timeout, cap)
        if out.truncated:
            raise KubeError(f"kubectl {' '.join(args[:2])} ({self.where}) printed {out.size} bytes, more than the "
                            f"{cap >> 20} MiB gpuk8s reads of it; nothing was read from it",
                            "name the nodes to look at (gpuk8s status NODE...) or report this with the log file")
        return out

    def _checked(self, args: list[str], stdin: str | None = None) -> Output:
        out = self._run(args, stdin)
        if not out.ok:
            raise KubeError(f"kubectl {args[0]} ({self.where}) failed: {out.tail()}",
                            "check the control plane (kubectl get nodes there) and re-run")
        return out

    def get(self, kind: str, name: str | None = None, namespace: str | None = None,
            field_selector: str | None = None) -> list[dict[str, Any]]:
        args = ["get", kind]
        if name is not None:
            args.append(name)
        if field_selector:
            args += ["--field-selector", field_selector]
        if namespace == "*":
            args.append("-A")
        elif namespace is not None:
            args += ["-n", namespace]
        out = self._run([*args, "-o", "json"])
        if not out.ok:
            if name is not None and "NotFound" in out.stderr:
                return []
            raise KubeError(f"kubectl get {kind} ({self.where}) failed: {out.tail()}",
                            "check the control plane (kubectl get nodes there) and re-run")
        try:
            if name is not None:
                return [state.load(out.stdout)]
            return state.items(out.stdout)
        except StateError as e:
            raise KubeError(f"kubectl get {kind} ({self.where}): {e}", "see the log file") from None

    def get_refs(self, refs: Sequence[ObjectRef]) -> dict[ObjectRef, dict[str, Any]]:
        groups: dict[str | None, list[ObjectRef]] = {}
        for ref in dict.fromkeys(refs):
            groups.setdefault(ref[2], []).append(ref)
        found: dict[ObjectRef, dict[str, Any]] = {}
        for namespace, group in groups.items():
            args = ["get", *(f"{kind.lower()}/{name}" for kind, name, _ in group)]
            out = self._run([*args, *(["-n", namespace] if namespace else []), "--ignore-not-found", "-o", "json"])
            if not out.ok:
                for ref in group:
                    try:
                        objs = self.get(ref[0].lower(), ref[1], ref[2])
                    except KubeError as e:
                        if NOT_SERVED in e.message:
                            continue  # a kind this API server does not serve: no such object
                        raise  # unread is not absent: a caller would take over or keep what it could not see
                    if objs:
                        found[ref] = objs[0]
                continue
            if not out.stdout.strip():
                continue  # none of them exists
            try:
                doc = state.load(out.stdout)
            except StateError as e:
                raise KubeError(f"kubectl get {args[1]}... ({self.where}): {e}", "see the log file") from None
            # one name: kubectl prints the object itself; more: a List of those found
            try:
                items = state.items_of(doc) if doc.get("kind") == "List" else [doc]
            except StateError as e:
                raise KubeError(f"kubectl get {args[1]}... ({self.where}): {e}", "see the log file") from None
            index = {(kind.lower(), name): ref for ref in group for kind, name, _ in [ref]}
            for item in items:
                md = item.get("metadata")
                key = (str(item.get("kind", "")).lower(), str(md.get("name", "")) if isinstance(md, dict) else "")
                if key in index:
                    found[index[key]] = item
        return found

    def apply(self, text: str) -> str:
        return self._checked(["apply", "-f", "-"], stdin=text).stdout

    def label(self, node: str, labels: dict[str, str | None]) -> None:
        self._checked(label_args(node, labels))

    def taint(self, node: str, taints: list[str]) -> None:
        self._checked(taint_args(node, taints))

    def delete(self, kind: str, names: list[str], namespace: str) -> None:
        if names:
            self._checked(["delete", kind, *names, "-n", namespace, "--ignore-not-found"])

    def logs(self, pod: str, namespace: str, tail: int = 50) -> str:
        # a tenant writes the log: kubectl stops at 1 MiB, and a cut log is still a log (its last lines matter)
        out = self._kubectl(["logs", f"--limit-bytes={LOG_CAP}", pod, "-n", namespace, f"--tail={tail}"],
                            cap=2 * LOG_CAP)
        return out.stdout if out.ok else out.stderr

    def events(self, namespace: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        return self.get("events", namespace=namespace if namespace is not None else "*", field_selector=field_selector)

    def raw_get(self, path: str, cap: int = RAW_CAP) -> str:
        if not path.startswith("/"):
            raise ValueError(f"an API path starts with '/': {path!r}")
        out = self._run(["get", "--raw", path], cap=cap)
        if not out.ok:
            raise KubeError(f"kubectl get --raw {path} ({self.where}) failed: {out.tail()}",
                            "check that the pod is Running and serves the port (kubectl get pods -o wide)")
        return out.stdout

    def drain(self, node: str, timeout_s: int) -> str:
        # kubectl's --timeout bounds the drain; the command's own limit leaves it a minute more to report
        out = self._run(drain_args(node, timeout_s), timeout=timeout_s + 60)
        if not out.ok:
            raise KubeError(f"kubectl drain {node} ({self.where}) failed: {out.tail()}",
                            f"see why the pods cannot leave; 'kubectl uncordon {node}' undoes the cordon")
        return out.stdout

    def delete_node(self, node: str) -> None:
        self._checked(["delete", "node", node, "--ignore-not-found"])

    def uncordon(self, node: str) -> None:
        self._checked(["uncordon", node])

    def cordon(self, node: str) -> None:
        self._checked(["cordon", node])


class SSHKubectl(Kubectl):
    """kubectl with admin.conf on a control plane, over the run's SSH session (the default)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.where = f"kubectl on {session.host.name}"

    def _kubectl(self, args: list[str], stdin: str | None = None, timeout: float | None = None,
                 cap: int | None = None) -> Output:
        cap = READ_CAP if cap is None else cap
        line = shlex.join(["kubectl", "--kubeconfig", ADMIN, *args])
        res = self.session.run(line, sudo=True, stdin=stdin.encode() if stdin is not None else None,
                               timeout=timeout, max_output=cap)
        # stdout decides (a long stderr is cut and only its last lines are shown anyway)
        return Output(res.ok, res.stdout, res.stderr, res.stdout_bytes > cap, res.stdout_bytes)


class LocalKubectl(Kubectl):
    """The operator's own kubectl with a kubeconfig file (`--kubeconfig`), e.g. from a laptop."""

    def __init__(self, kubeconfig: str, context: str | None = None, timeout: float = 60) -> None:
        exe = shutil.which("kubectl")
        if exe is None:
            raise KubeError("--kubeconfig needs kubectl on this machine and there is none in PATH",
                            "install kubectl, or leave out --kubeconfig to use kubectl on the control plane")
        self.exe = exe
        self.kubeconfig = kubeconfig
        self.context = context
        self.timeout = timeout
        self.where = f"kubectl with {kubeconfig}"

    def _kubectl(self, args: list[str], stdin: str | None = None, timeout: float | None = None,
                 cap: int | None = None) -> Output:
        timeout = max(timeout or 0, self.timeout)
        cap = READ_CAP if cap is None else cap
        argv = [self.exe, "--kubeconfig", self.kubeconfig, *(["--context", self.context] if self.context else []),
                *args]
        # stdout goes to a file, so that its size is known before any of it is read into memory; kubectl is
        # stopped as soon as it has written more than the cap (it must not fill the disk until its timeout)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            p = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                 stdout=out, stderr=err)
            if stdin is not None and p.stdin is not None:
                try:
                    p.stdin.write(stdin.encode())
                    p.stdin.close()
                except BrokenPipeError:
                    pass
            deadline = time.monotonic() + timeout
            delay = 0.005
            while p.poll() is None:
                if os.fstat(out.fileno()).st_size > cap or os.fstat(err.fileno()).st_size > cap:
                    p.kill()
                    p.wait()
                    break
                if time.monotonic() > deadline:
                    p.kill()
                    p.wait()
                    return Output(False, "", f"kubectl did not finish within {timeout:g} s")
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
            size = os.fstat(out.fileno()).st_size
            out.seek(0)
            err.seek(0)
            text = out.read(cap).decode("utf-8", "replace")
            etext = err.read(1 << 20).decode("utf-8", "replace")
        return Output(p.returncode == 0 and size <= cap, clean(text), clean(etext), size > cap, size)
