"""Install part 2 as phases over the control plane's SSH session: init, kubeconfig, CNI, join, GPU nodes, verify.

Each phase checks what is already there first, so a re-run on a running cluster changes nothing and a
stopped run can be re-run to completion. The Kubernetes API is reached with kubectl on the first control
plane (admin.conf), so the user needs no local kubectl. Tokens and certificate keys are minted here,
registered as secrets (masked everywhere) and handed to kubeadm in 0600 files sent over stdin.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuk8s.facts.model import HostFacts
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.kube import render, state
from gpuk8s.kube.state import NodeCheck, StateError
from gpuk8s.localfiles import LocalFileError, merge_kubeconfig, write_private
from gpuk8s.logs import mask, register_secret
from gpuk8s.playbook.script import lines_that_matter
from gpuk8s.remote import RemoteError, Result, Session, for_each_host
from gpuk8s.text import clean
from gpuk8s.versions import manifest_sha256

log = logging.getLogger("gpuk8s.kube")

ADMIN = "/etc/kubernetes/admin.conf"
KUBECTL = f"kubectl --kubeconfig {ADMIN}"
CNI_DAEMONSETS = {"calico": "calico-node", "flannel": "kube-flannel-ds"}


class PhaseError(Exception):
    def __init__(self, message: str, remedy: str = "") -> None:
        # often quotes a command's output: shown text, so masked and without control characters
        message = mask(clean(message))
        super().__init__(message)
        self.message = message
        self.remedy = mask(clean(remedy))


def secret_path(name: str) -> str:
    """A path for a file with a secret on a host, unique to this run (two runs never share one)."""
    return f"/etc/kubernetes/gpuk8s-{name}-{secrets.token_hex(6)}.yaml"


@dataclass
class PhaseResult:
    name: str
    title: str
    status: str = "pending"  # changed | unchanged | failed | skipped
    message: str = ""
    remedy: str = ""
    hosts: dict[str, str] = field(default_factory=dict)  # per host: what happened

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": self.status, "message": self.message,
                "remedy": self.remedy, "hosts": self.hosts}


def gpu_count(host: Host, facts: HostFacts | None) -> int:
    if facts is not None and facts.gpu.gpus:
        return len(facts.gpu.gpus)
    return host.gpus or 0


def _tail(res: Result, n: int = 8) -> str:
    return " | ".join(lines_that_matter(res.stderr + "\n" + res.stdout, n))


class ClusterOps:
    def __init__(self, inv: Inventory, sessions: dict[str, Session], facts: dict[str, HostFacts],
                 concurrency: int = 16, emit: Callable[[str], None] | None = None) -> None:
        self.inv = inv
        self.sessions = sessions
        self.facts = facts
        self.concurrency = concurrency
        self.emit = emit or (lambda line: None)
        self.cp = inv.control_planes[0]

    # -- helpers --------------------------------------------------------------
    @property
    def cps(self) -> Session:
        s = self.sessions.get(self.cp.name)
        if s is None:
            raise PhaseError(f"the first control plane {self.cp.name} is not reachable",
                             "bring it back (see the preflight report), then re-run")
        return s

    def kubectl(self, args: str, stdin: str | None = None, check: bool = True) -> Result:
        res = self.cps.run(f"{KUBECTL} {args}", sudo=True, stdin=stdin.encode() if stdin else None)
        if check and not res.ok:
            raise PhaseError(f"kubectl {args.split()[0]} on {self.cp.name} failed: {_tail(res)}",
                             "check the control plane (kubectl get nodes there) and re-run")
        return res

    def get_items(self, args: str) -> list[dict[str, Any]]:
        try:
            return state.items(self.kubectl(f"get {args} -o json").stdout)
        except StateError as e:
            raise PhaseError(f"kubectl get {args}: {e}", "see the log file") from None

    def device_plugin_ds(self) -> state.DaemonSetState | None:
        res = self.kubectl(f"get ds -n kube-system {state.DEVICE_PLUGIN} -o json", check=False)
        if not res.ok:
            return None
        try:
            return state.daemonset_state(state.load(res.stdout))
        except StateError:
            return None

    @staticmethod
    def put_secret_file(s: Session, path: str, content: str) -> None:
        """Write a 0600 file on the host from stdin: its content never appears on a command line."""
        q = shlex.quote(path)
        res = s.run(f"umask 077; mkdir -p {shlex.quote(os.path.dirname(path))} && cat > {q}.tmp && mv -f {q}.tmp {q}",
                    sudo=True, stdin=content.encode())
        if not res.ok:
            raise RemoteError("write", f"cannot write {path} on {s.host.name}: {_tail(res)}", "check the disk")

    @staticmethod
    def run_with_secret(s: Session, name: str, content: str, command: Callable[[str], str],
                        timeout: float | None = None) -> Result:
        """Run `command(file)` with `content` in a 0600 file of this run, sent on stdin, removed on exit.

        Writing the file and running the command are one remote command: the host removes the file when
        the command ends, also when gpuk8s has gone away. The byte count is checked, so a cut-off transfer
        never reaches kubeadm as a shorter, still valid, configuration.
        """
        data = content.encode()
        f = secret_path(name)
        script = (f"umask 077; mkdir -p /etc/kubernetes && f={f} && trap 'rm -f \"$f\"' EXIT && "
                  f"head -c {len(data)} > \"$f\" && [ \"$(wc -c < \"$f\")\" -eq {len(data)} ] || "
                  "{ echo 'the configuration did not arrive whole' >&2; exit 1; }\n" + command(f))
        return s.run(script, sudo=True, stdin=data, timeout=timeout,
                     display=f"{command(f).splitlines()[0][:200]} (with {f} from stdin)")

    def initialized(self) -> bool:
        return self.cps.run(f"test -s {ADMIN}", sudo=True).ok

    def node_names(self) -> set[str]:
        return set(state.by_name(self.get_items("nodes")))

    # -- phases -----------------------------------------------------------------
    def init(self) -> PhaseResult:
        r = PhaseResult("init", f"kubeadm init on {self.cp.name}")
        if self.initialized():
            r.status, r.message = "unchanged", f"{self.cp.name} already runs a control plane ({ADMIN} exists)"
            return r
        s = self.cps
        ver = s.run("kubeadm version -o short", sudo=True)
        version = ver.stdout.strip() if ver.ok and ver.stdout.strip().startswith("v") else render.full_version(self.inv)
        token = render.new_token()
        key = render.new_certificate_key() if len(self.inv.control_planes) > 1 else None
        register_secret(token)
        register_secret(key)
        # the configuration for reference, without the token and the certificate key; the one kubeadm reads
        # has them, under a name of this run, and the host removes it when kubeadm ends, even if gpuk8s is gone
        self.put_secret_file(s, "/etc/kubernetes/gpuk8s-kubeadm.yaml",
                             render.kubeadm_init_config(self.inv, self.cp, version, None, None))
        res = self.run_with_secret(
            s, "init", render.kubeadm_init_config(self.inv, self.cp, version, token, key),
            lambda f: to_the_end(f"kubeadm init --config {f}" + (" --upload-certs" if key else ""), "kubeadm-init"),
            timeout=900)
        if not res.ok:
            raise PhaseError(f"kubeadm init on {self.cp.name} failed (exit status {res.exit_status}): {_tail(res)}",
                             f"fix the cause on {self.cp.name}; if kubeadm left a partial control plane, run "
                             "'kubeadm reset -f' there; then re-run gpuk8s install")
        r.status = "changed"
        r.message = f"control plane {version} on {self.cp.name}, API at {render.endpoint(self.inv)}"
        return r

    def fetch_kubeconfig(self, dest: Path, *, force: bool = False, merge: bool = False) -> PhaseResult:
        r = PhaseResult("kubeconfig", f"admin kubeconfig to {dest}")
        res = self.cps.run(f"cat {ADMIN}", sudo=True, quiet=True)
        if not res.ok or "apiVersion" not in res.stdout:
            raise PhaseError(f"cannot read {ADMIN} on {self.cp.name}", "check that kubeadm init finished")
        try:
            w = (merge_kubeconfig(dest, res.stdout, self.inv.cluster.name) if merge
                 else write_private(dest, res.stdout, force=force))
        except LocalFileError as e:
            raise PhaseError(e.message, e.remedy) from None
        r.status, r.message = ("changed" if w.changed else "unchanged"), w.message
        return r

    def cni(self) -> PhaseResult:
        c = self.inv.cluster
        name = CNI_DAEMONSETS[c.cni]
        r = PhaseResult("cni", f"{c.cni} with pod CIDR {c.pod_cidr}")
        existing = set(state.by_name(self.get_items("daemonsets -A")))
        if name in existing:
            r.status, r.message = "unchanged", f"{name} DaemonSet exists"
            return r
        url = self.inv.install.calico_manifest if c.cni == "calico" else self.inv.install.flannel_manifest
        # Calico reads the pod CIDR from kubeadm's configuration; Flannel's manifest carries its own, replaced here.
        fix = (f" && sed -i 's#\"Network\": \"10.244.0.0/16\"#\"Network\": \"{c.pod_cidr}\"#' \"$f\""
               if c.cni == "flannel" else "")
        want = manifest_sha256(self.inv, c.cni)
        # https stays https through redirects; plain http only where the inventory pinned the sha256
        proto = "--proto =https --proto-redir =https" if url.startswith("https://") else "--proto =http,https"
        # checked before anything is applied: a mirror or a path that serves other bytes applies nothing
        verify = (f" && {{ printf '%s  %s\\n' {want} \"$f\" | sha256sum -c --status || {{ echo \"sha256 of the "
                  f"manifest is $(sha256sum < \"$f\" | cut -d' ' -f1), not the pinned {want}\" >&2; false; }}; }}"
                  if want else "")
        script = (f"f=$(mktemp) && curl -fsSL {proto} --retry 2 -o \"$f\" {shlex.quote(url)}{verify}{fix} && "
                  f"{KUBECTL} apply -f \"$f\"; rc=$?; rm -f \"$f\"; exit $rc")
        res = self.cps.run(script, sudo=True, timeout=300)
        if not res.ok:
            raise PhaseError(f"applying {c.cni} from {url} failed: {_tail(res)}",
                             "check that the control plane reaches that URL (or set install.*_manifest to a mirror)")
        r.status, r.message = "changed", f"applied {url}"
        return r

    def join(self, only: list[Host] | None = None) -> PhaseResult:
        r = PhaseResult("join", "join the other control planes and the workers")
        present = self.node_names()
        todo = [h for h in (only if only is not None else self.inv.hosts) if h.name != self.cp.name]
        for h in todo:
            if h.name in present:
                r.hosts[h.name] = "already in the cluster"
        todo = [h for h in todo if h.name not in present]
        missing = [h.name for h in todo if h.name not in self.sessions]
        for name in missing:
            r.hosts[name] = "failed: not reachable"
        todo = [h for h in todo if h.name in self.sessions]
        if not todo:
            r.status = "failed" if missing else "unchanged"
            r.message = "every host is already in the cluster" if not missing else f"unreachable: {', '.join(missing)}"
            return r
        s = self.cps
        token = render.new_token()
        register_secret(token)
        res = self.run_with_secret(s, "token", render.token_config(self.inv, token),
                                   lambda f: f"kubeadm token create --config {f} --print-join-command")
        m = re.search(r"kubeadm join (\S+) .*--discovery-token-ca-cert-hash (sha256:[0-9a-f]{64})", res.stdout)
        if not res.ok or not m:
            raise PhaseError(f"kubeadm token create on {self.cp.name} failed: {_tail(res)}",
                             "check the control plane, then re-run")
        api, ca_hash = m.group(1), m.group(2)
        key = None
        if any(h.is_control_plane for h in todo):
            key = render.new_certificate_key()
            register_secret(key)
            up = self.run_with_secret(s, "certs", render.upload_certs_config(self.inv, key),
                                      lambda f: to_the_end(f"kubeadm init phase upload-certs --upload-certs "
                                                           f"--config {f}", "upload-certs"))
            if not up.ok:
                raise PhaseError(f"uploading control-plane certificates failed: {_tail(up)}", "re-run")

        def one(h: Host) -> str:
            hs = self.sessions[h.name]
            if hs.run("test -e /etc/kubernetes/kubelet.conf", sudo=True).ok:
                raise PhaseError(f"{h.name} has /etc/kubernetes/kubelet.conf but is not a node of this cluster "
                                 "(joined elsewhere, or a half-finished join)",
                                 f"run 'kubeadm reset -f' on {h.name} if it belongs to no other cluster, then re-run")
            res = self.run_with_secret(hs, "join", render.join_config(self.inv, h, api, token, ca_hash, key),
                                       lambda f: to_the_end(f"kubeadm join --config {f}", "kubeadm-join"),
                                       timeout=900)
            if not res.ok and "dial tcp" in res.stderr + res.stdout:
                raise PhaseError(f"{h.name} cannot reach the API server at {api}: {_tail(res)}",
                                 f"let {h.name} reach TCP {api} (firewall, route, security group), then run "
                                 "gpuk8s join again")
            if not res.ok:
                raise PhaseError(f"kubeadm join on {h.name} failed (exit status {res.exit_status}): {_tail(res)}",
                                 f"fix the cause on {h.name} (can it reach {api}?), then re-run")
            self.emit(f"{h.name}: joined")
            return "joined"

        results = for_each_host(todo, one, self.concurrency)
        problems = []
        for name, v in results.items():
            if isinstance(v, BaseException):
                msg = v.message if isinstance(v, (PhaseError, RemoteError)) else f"{type(v).__name__}: {v}"
                r.hosts[name] = f"failed: {msg}"
                problems.append(v)
            else:
                r.hosts[name] = v
        if problems or missing:
            r.status = "failed"
            r.message = "; ".join(f"{n}: {t}" for n, t in r.hosts.items() if t.startswith("failed"))
            first = problems[0] if problems else None
            r.remedy = first.remedy if isinstance(first, (PhaseError, RemoteError)) else "re-run"
        else:
            r.status, r.message = "changed", f"joined {len(todo)} host(s)"
        return r

    def gpu_nodes(self) -> PhaseResult:
        r = PhaseResult("gpu", "NVIDIA device plugin, GPU labels and taints")
        changed = []
        manifest = render.device_plugin(self.inv)
        want_hash = re.search(r'gpuk8s.io/manifest-hash: "(\w+)"', manifest)
        current = self.device_plugin_ds()
        have = current.annotations.get("gpuk8s.io/manifest-hash", "") if current else ""
        if not want_hash or have != want_hash.group(1):
            self.kubectl("apply -f -", stdin=manifest)
            changed.append(f"device plugin {self.inv.install.device_plugin_version}")
        nodes = state.by_name(self.get_items("nodes"))
        for h in self.inv.hosts:
            if h.name not in nodes:
                continue
            try:
                node = state.node_state(nodes[h.name])
            except StateError as e:
                raise PhaseError(f"the node object of {h.name} is unreadable: {e}", "see the log file") from None
            diff, new = node_changes(h, node, gpu_count(h, self.facts.get(h.name)))
            if diff:
                self.kubectl(f"label node {shlex.quote(h.name)} {render.label_args(diff)} --overwrite")
                r.hosts[h.name] = "labelled " + ", ".join(sorted(diff))
                changed.append(f"labels on {h.name}")
            if new:
                self.kubectl(f"taint node {shlex.quote(h.name)} {render.taint_args(new)} --overwrite")
                r.hosts[h.name] = (r.hosts.get(h.name, "") + " tainted " + ", ".join(new)).strip()
                changed.append(f"taints on {h.name}")
        r.status = "changed" if changed else "unchanged"
        r.message = "; ".join(changed) if changed else "device plugin, labels and taints as wanted"
        return r

    def verify(self, test_pods: bool = True, timeout: float = 300) -> tuple[PhaseResult, list[NodeCheck]]:
        r = PhaseResult("verify", "every node Ready, every GPU schedulable")
        nodes = state.by_name(self.get_items("nodes"))
        pods = state.pod_states(self.get_items("pods -A"))
        plugin = self.device_plugin_ds()
        checks = []
        for h in self.inv.hosts:
            f = self.facts.get(h.name)
            runtime_default = None
            if f is not None:
                runtime_default = (f.containerd_config.default_runtime
                                   if self.inv.cluster.container_runtime == "containerd"
                                   else f.docker_daemon.default_runtime) or ""
            problem = (f.gpu.error or f.gpu.state) if f is not None and f.gpu.state != "ok" else ""
            checks.append(state.check_node(h.name, gpu_count(h, f), nodes.get(h.name), pods, plugin,
                                           driver_problem=problem, runtime_default=runtime_default))
        if test_pods:
            self._test_pods([c for c in checks if c.ok and c.expected_gpus], timeout)
        bad = [c for c in checks if not c.ok]
        r.status = "failed" if bad else "passed"
        r.message = state.summary(checks)
        if bad:
            r.remedy = "fix the named cause on each node, then run gpuk8s verify (or gpuk8s install) again"
        return r, checks

    def _test_pods(self, checks: list[NodeCheck], timeout: float) -> None:
        """One pod per GPU node, all applied at once and polled together: a few kubectl calls in all."""
        if not checks:
            return
        docs = []
        for c in checks:
            f = self.facts.get(c.node)
            c.pod = f"gpuk8s-verify-{c.node}"[:63]
            image = render.verify_image(self.inv, f.gpu.driver_release if f else None)
            docs.append(render.test_pod(c.pod, c.node, image))
        names = " ".join(shlex.quote(c.pod) for c in checks)
        self.kubectl(f"delete pod {names} -n default --ignore-not-found", check=False)
        self.kubectl("apply -f -", stdin="---\n".join(docs))
        deadline = time.monotonic() + timeout
        waiting = {c.pod: c for c in checks}
        last: dict[str, str] = {}
        while waiting:
            pods = {p.name: p for p in state.pod_states(self.get_items("pods -n default"))}
            for name, c in list(waiting.items()):
                last[name] = state.pod_progress(pods.get(name))
                verdict = state.test_pod_verdict(pods.get(name))
                if verdict is None:
                    continue
                c.ok, c.cause = verdict
                del waiting[name]
            if not waiting:
                break
            if time.monotonic() > deadline:
                for name, c in waiting.items():
                    c.ok, c.cause = False, f"the test pod {name} did not finish within {timeout:g} s ({last[name]})"
                break
            time.sleep(2)
        self.kubectl(f"delete pod {names} -n default --ignore-not-found", check=False)


def to_the_end(command: str, name: str, then: str = "") -> str:
    """`command` made to finish even if gpuk8s goes away: its output goes to a 0600 file, printed afterwards.

    A kubeadm writing to a broken SSH channel would die of SIGPIPE half-way (a half-initialised control
    plane needs `kubeadm reset`); writing to a file, it completes and the re-run finds it done.
    """
    # a file of this run only (mktemp: 0600, a fresh name), so kubeadm keeps the caller's umask and two
    # runs never share one; kubeadm init prints the join token, so the file is unlinked before it is
    # printed: a reader that went away (SIGPIPE on cat) cannot leave it behind
    return (f"mkdir -p /var/lib/gpuk8s && out=$(mktemp /var/lib/gpuk8s/{name}.XXXXXXXXXX) || exit 1; "
            f"{command} > \"$out\" 2>&1 </dev/null; rc=$?; {then + '; ' if then else ''}"
            "exec 3<\"$out\"; rm -f \"$out\"; cat <&3; exit $rc")


def node_changes(h: Host, node: state.NodeState, gpus: int) -> tuple[dict[str, str], list[str]]:
    """The labels to set and the taints to add so that the node matches the inventory."""
    taints = state.missing_taints([(t.key, t.value, t.effect) for t in h.taints], node)
    return (state.label_changes(render.wanted_labels(h, gpus), node),
            [str(t) for t in h.taints if (t.key, t.value, t.effect) in taints])
