"""Phase verify: every node Ready and every resource of its GPU plan allocatable, then one test pod per GPU
node through the scheduler. The verdicts are decided by gpuk8s/kube/state.py from the cluster's JSON.

On a node whose plan shares its GPUs (docs/sharing.md) allocatable must be GPUs x replicas under the plan's
resource name, and with test pods the sharing proof runs: GPUs x replicas one-slice pods pinned to the node (all
must be bound) and one more (it must stay Pending: Insufficient ...), then, under failRequestsGreaterThanOne, a
pod asking for 2 (the plugin must refuse it: UnexpectedAdmissionError); on a HAMi node a pod asking for GPU
memory (nvidia.com/gpumem) must be bound. Every proof pod is deleted afterwards.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from gpuk8s import versions
from gpuk8s.gpuplan import ALLOCATOR_LABEL, GPU_RESOURCE, HAMI_CORES, HAMI_MEMORY, GPUPlan
from gpuk8s.kube import allocation, dra, manifests, render, state
from gpuk8s.kube.client import KubeError, on_node
from gpuk8s.kube.state import DaemonSetState, NodeCheck, StateError
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult
from gpuk8s.phases.poll import until

TEST_NAMESPACE = "default"
POLL_S = 2.0  # how often verify reads the nodes again while a relabelled node's plugin catches up


def device_plugin(ctx: Context) -> DaemonSetState | None:
    found = ctx.kube.get("daemonset", state.DEVICE_PLUGIN, "kube-system")
    try:
        return state.daemonset_state(found[0]) if found else None
    except StateError:
        return None


def _pod_name(prefix: str, node: str, suffix: str = "") -> str:
    """PREFIX-NODE[-SUFFIX], valid as a pod name (at most 63 characters, a DNS subdomain): a node name too long
    for it is cut (never ending in '.' or '-') and followed by a short hash of the whole name, so two nodes alike
    in their first characters get different pods."""
    tail = f"-{suffix}" if suffix else ""
    name = f"{prefix}-{node}{tail}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    cut = node[:63 - len(prefix) - len(digest) - len(tail) - 2].rstrip(".-")
    return f"{prefix}-{cut}-{digest}{tail}"


def test_pod_name(node: str) -> str:
    return _pod_name("gpuk8s-verify", node)


def extended_pod_name(node: str) -> str:
    """A dra node's second test pod where the DeviceClass names nvidia.com/gpu (KEP-5004, extended_mapping)."""
    return _pod_name("gpuk8s-verify-ext", node)


def claim_template_name(kind: str) -> str:
    return f"gpuk8s-verify-{kind}"


def dra_class(plan: GPUPlan) -> str:
    """The device type a dra node's test pod claims: a MIG device where the node has only those, else a whole GPU
    (also where the plan does not know its devices)."""
    return "mig" if plan.dra_devices.get("mig") and not plan.dra_devices.get("gpu") else "gpu"


def offered(ctx: Context, plan: GPUPlan) -> tuple[bool, str]:
    """kube/dra.offers for one node, its object and the slices read now (two reads)."""
    found = ctx.kube.get("nodes", plan.node)
    if not found:
        return False, "not a node of the cluster"
    return dra.offers(plan, found[0], dra.published(ctx.kube.get("resourceslices")).get(plan.node))


def foreign_names(ctx: Context, refs: list[tuple[str, str, str]]) -> set[str]:
    """The names of those of `refs` that exist and that gpuk8s did not create (one read): verify neither deletes nor
    overwrites them."""
    return {ref[1] for ref, obj in ctx.kube.get_refs(refs).items() if not manifests.created_by_gpuk8s(obj)}


def name_taken(c: NodeCheck, what: str, taken: list[str]) -> None:
    """The node's verdict where a test object's name is another's (gpu.test-name-taken)."""
    c.ok, c.cause_id = False, "gpu.test-name-taken"
    c.cause = (f"{what}: {', '.join(taken)} in namespace {TEST_NAMESPACE} exist(s) and gpuk8s did not create it: "
               "left alone")
    c.remedy = f"rename or delete {', '.join(taken)} in {TEST_NAMESPACE}, then run gpuk8s verify again"


def wait_offered(ctx: Context, plan: GPUPlan, timeout: float, poll: float) -> tuple[bool, str]:
    """Until the node's allocator offers its GPUs (offered), at most `timeout` seconds."""
    return until(lambda: offered(ctx, plan), timeout, poll)


def extended_mapping(ctx: Context) -> bool:
    """Whether pods asking nvidia.com/gpu are served on dra nodes (gpuk8s writes extendedResourceName from then)."""
    minor = versions.release(ctx.inv.cluster.kubernetes_version) or (1, 0)
    return minor[1] >= versions.dra_driver().extended_resource_since


def proof_pod_name(node: str, suffix: str) -> str:
    return _pod_name("gpuk8s-share", node, suffix)


def mig_check(ctx: Context, plan: GPUPlan, c: NodeCheck, node: Any) -> None:
    """state.mig_verdict with the MIG devices of the host's facts."""
    state.mig_verdict(plan, c, node, state.mig_devices(ctx.facts.get(plan.node)))


class Verify(Phase):
    name = "verify"
    title = "verify every node and GPU"
    fatal = False

    def plan(self, ctx: Context) -> PhasePlan:
        # not a node held back or quarantined by the health phase (this run's, or a node's taint from before):
        # verify tests neither
        nodes = state.by_name(ctx.kube.get("nodes")) if ctx.options.test_pods and ctx.initialized() else {}
        skip = set(ctx.quarantine) | set(ctx.held) | {n for n, obj in nodes.items() if state.quarantined(obj)}
        gpu_nodes = [p.node for p in ctx.plans.values() if (p.expected_gpus or p.dra_devices) and p.node not in skip]
        changes = []
        if ctx.options.test_pods:
            kinds = sorted({dra_class(ctx.plans[n]) for n in gpu_nodes if ctx.plans[n].dra})
            changes = [Change(f"ResourceClaimTemplate {claim_template_name(k)} for the dra nodes' test pods "
                              "(created, then deleted)", manifest=self._claim_template(k)) for k in kinds]
            changes += [Change(f"test pod on {n} (created, then deleted)", manifest=self._pod(ctx, n))
                        for n in gpu_nodes]
            if extended_mapping(ctx):
                changes += [Change(f"test pod asking nvidia.com/gpu on the dra node {n} (created, then deleted)",
                                   manifest=self._extended_pod(ctx, n)) for n in gpu_nodes
                            if ctx.plans[n].dra and dra_class(ctx.plans[n]) == "gpu"]
            for p in ctx.plans.values():
                if p.expected_gpus and p.sharing != "none" and p.node in gpu_nodes:
                    what = (f"{p.expected_gpus} + 1 one-slice pods" if p.sharing != "hami"
                            else "one pod asking for GPU memory")
                    limits = ({p.resource_name: 1} if p.sharing != "hami"
                              else {GPU_RESOURCE: 1, HAMI_MEMORY: 4096, HAMI_CORES: 10})
                    changes.append(Change(f"sharing proof on {p.node}: {what} (created, then deleted)",
                                          manifest=self._proof_pod(ctx, proof_pod_name(p.node, "0"), p.node,
                                                                   limits, hami=p.sharing == "hami")))
        return self.planned("would-change" if changes else "unchanged",
                            "every node Ready, every GPU of each node's plan allocatable" +
                            (", one nvidia-smi test pod per GPU node" if changes else ""), changes)

    @staticmethod
    def _claim_template(kind: str) -> str:
        return render.claim_template(claim_template_name(kind), TEST_NAMESPACE, dra.DRA_CLASSES[kind])

    @staticmethod
    def _image(ctx: Context, node: str) -> str:
        f = ctx.facts.get(node)
        return render.verify_image(ctx.inv, f.gpu.driver_release if f else None)

    def _extended_pod(self, ctx: Context, node: str) -> str:
        return render.test_pod(extended_pod_name(node), node, self._image(ctx, node))

    def _pod(self, ctx: Context, node: str) -> str:
        image = self._image(ctx, node)
        plan = ctx.plans.get(node)
        if plan is not None and plan.dra:  # one GPU (or MIG device) through a claim
            return render.claim_test_pod(test_pod_name(node), node, image, claim_template_name(dra_class(plan)))
        text = render.test_pod(test_pod_name(node), node, image)
        if plan is None or (plan.resource_name == GPU_RESOURCE and plan.sharing != "hami"):
            return text
        doc = yaml.safe_load(text)  # one GPU, or one slice of one, under the plan's name
        doc["spec"]["containers"][0]["resources"] = {"limits": {plan.resource_name: 1}}
        if plan.sharing == "hami":
            doc["spec"]["schedulerName"] = "hami-scheduler"
        return yaml.safe_dump(doc, sort_keys=False)

    def run(self, ctx: Context) -> PhaseResult:
        self._configs = False
        self._settle(ctx)
        nodes = state.by_name(ctx.kube.get("nodes"))
        # the node checks look at the GPU daemons' pods only (the plugin's, MPS's, HAMi's: all in kube-system), not
        # at every pod of the cluster
        pods = state.pod_states(ctx.kube.get("pods", namespace="kube-system"))
        plugin = device_plugin(ctx)
        checks = []
        for h in ctx.inv.hosts:
            plan = ctx.plans[h.name]
            f = ctx.facts.get(h.name)
            runtime_default = None
            if f is not None:
                runtime_default = (f.containerd_config.default_runtime
                                   if ctx.inv.cluster.container_runtime == "containerd"
                                   else f.docker_daemon.default_runtime) or ""
            problem = (f.gpu.error or f.gpu.state) if f is not None and f.gpu.state != "ok" else ""
            checks.append(state.check_node(h.name, plan.expected_gpus, nodes.get(h.name), pods,
                                           plugin, driver_problem=problem, runtime_default=runtime_default,
                                           resource=plan.resource_name, sharing=self._sharing(ctx, plan)))
        for c in checks:
            if c.node in ctx.held and not c.ok and c.cause_id == "node.not-joined":
                # left out on purpose by this run's health phase: why, and what to do, not `gpuk8s join`
                c.cause = f"not joined: held back by the health phase ({ctx.held[c.node]})"
                c.remedy = (f"gpuk8s health {c.node} names the fault; once fixed, gpuk8s join {c.node} (or set "
                            "health.on_failure: quarantine to join it tainted)")
            if ctx.plans[c.node].mig_strategy != "none":
                mig_check(ctx, ctx.plans[c.node], c, nodes.get(c.node))
            c.quarantine = state.quarantined(nodes.get(c.node)) if c.ready else ""  # not Ready: that is its verdict
        self._dra_checks(ctx, checks, nodes)
        if ctx.options.test_pods:
            # a quarantined node is not tested: its GPUs failed the health check, and it takes no new pods
            tested = [c for c in checks if c.ok and c.expected_gpus and not c.quarantine]
            self.test_pods(ctx, tested)
            self._sharing_proofs(ctx, [c for c in tested if ctx.plans[c.node].sharing != "none"])
        ctx.nodes = checks
        bad = [c for c in checks if not c.ok and not c.quarantine]
        r = self.result("failed" if bad else "passed", state.summary(checks))
        if bad:
            r.remedy = "fix the named cause on each node, then run gpuk8s verify (or gpuk8s install) again"
        return r

    _configs: tuple[str, ...] | None | bool = False  # the plugin ConfigMap's config names, read once per run

    @staticmethod
    def _dra_checks(ctx: Context, checks: list[NodeCheck], nodes: dict[str, Any]) -> None:
        """On each dra node that is Ready: every device its plan expects published in its ResourceSlice (one read
        of the slices for all)."""
        for c in checks:  # a node not moved yet (install held it: GPU pods on it) is named as such, not as broken
            node = nodes.get(c.node)
            differs = dra.allocator_differs(ctx.plans[c.node], node) if c.ready and node is not None else None
            if differs is not None:  # the cause of what check_node saw, if anything
                c.ok, c.cause_id, c.cause, c.head = False, differs.id, differs.cause, ""
                c.evidence, c.remedy = list(differs.evidence), differs.remedy
        mine = [c for c in checks if ctx.plans[c.node].dra and c.ready and c.cause_id != "node.allocator-differs"]
        if not mine:
            return
        published = dra.published(ctx.kube.get("resourceslices"))
        for c in checks:  # a node both allocators serve would hand out its GPUs twice
            node = nodes.get(c.node)
            twice = dra.double_served(ctx.plans[c.node], node, published.get(c.node)) \
                if c.ok and c.ready and node is not None else None
            if twice is not None:
                c.ok, c.cause_id, c.cause, c.remedy = False, twice.id, twice.cause, twice.remedy
        for c in mine:
            want = ctx.plans[c.node].dra_devices
            c.resource = f"{dra.DRA_DRIVER} (DRA)"
            c.expected_gpus = sum(want.values())
            c.allocatable_gpus, cause_id, cause, evidence = dra.verdict(c.node, want, published.get(c.node))
            if cause and c.ok:
                c.ok, c.cause_id, c.cause = False, cause_id, cause
                c.evidence += evidence
                c.remedy = (f"kubectl -n {dra.DRA_NAMESPACE} get pods -o wide (the kubelet plugin's pod on "
                            f"{c.node}) and its logs; the plugin runs on nodes labelled "
                            f"{ALLOCATOR_LABEL}=dra (gpuk8s install sets it)")

    def _sharing(self, ctx: Context, plan: GPUPlan) -> state.Sharing | None:
        if plan.sharing == "none" or not plan.gpus:
            return None
        if self._configs is False:
            found = ctx.kube.get("configmap", manifests.PLUGIN_CONFIGS, "kube-system")
            data = found[0].get("data") if found else None
            self._configs = tuple(sorted(data)) if isinstance(data, dict) else None
        return state.Sharing(plan.sharing, plan.replicas, plan.gpus, plan.plugin.config_name if plan.plugin else "",
                             self._configs if self._configs is not False else None)  # type: ignore[arg-type]

    def _proof_pod(self, ctx: Context, name: str, node: str, limits: dict[str, int], hami: bool = False) -> str:
        f = ctx.facts.get(node)
        doc: dict[str, Any] = yaml.safe_load(render.test_pod(name, node, render.verify_image(
            ctx.inv, f.gpu.driver_release if f else None)))
        doc["metadata"]["labels"]["gpuk8s.io/proof"] = "sharing"
        c = doc["spec"]["containers"][0]
        c["name"], c["command"], c["resources"] = "slice", ["sleep", "3600"], {"limits": limits}
        doc["spec"]["terminationGracePeriodSeconds"] = 0
        if hami:
            doc["spec"]["schedulerName"] = "hami-scheduler"  # no HAMi webhook: the pod names HAMi's scheduler
        return yaml.safe_dump(doc, sort_keys=False)

    def _wait(self, ctx: Context, names: list[str], done: Any) -> dict[str, state.PodState]:
        """Poll the pods until done(pods by name) or the test pod timeout; the last pods seen."""
        def seen() -> tuple[bool, dict[str, state.PodState]]:
            pods = {p.name: p for p in state.pod_states(ctx.kube.get("pods", namespace=TEST_NAMESPACE))
                    if p.name in names}
            return bool(done(pods)), pods

        return until(seen, ctx.options.test_pod_timeout, 1)[1]

    def _sharing_proofs(self, ctx: Context, checks: list[NodeCheck]) -> None:
        for c in checks:
            plan = ctx.plans[c.node]
            # the names the proof deletes and creates, read first: another's pod of such a name is left alone
            names = [proof_pod_name(plan.node, "mem")] if plan.sharing == "hami" else [
                proof_pod_name(plan.node, str(i)) for i in range(c.expected_gpus + 1)] + [proof_pod_name(plan.node,
                                                                                                 "two")]
            taken = sorted(foreign_names(ctx, [("Pod", n, TEST_NAMESPACE) for n in names]))[:4]
            if taken:
                name_taken(c, "sharing proof not run", taken)
                continue
            try:
                ok, proof = (self._hami_proof(ctx, plan) if plan.sharing == "hami"
                             else self._slice_proof(ctx, plan, c.expected_gpus))
            except state.StateError as e:
                ok, proof = False, f"the proof pods could not be read: {e}"
            except KubeError as e:  # the API refused a proof pod (or kubectl failed): a verdict, not a crash
                ok, proof = False, f"sharing proof: {e}"
            if ok:
                c.proof = proof
            else:
                c.ok, c.cause, c.cause_id = False, proof, "gpu.sharing-proof"
                c.remedy = (f"see kubectl describe pod of the proof pods (label gpuk8s.io/proof=sharing) on {c.node} "
                            "and docs/sharing.md (debugging)")

    def _slice_proof(self, ctx: Context, plan: GPUPlan, slices: int) -> tuple[bool, str]:
        res = plan.resource_name
        two = proof_pod_name(plan.node, "two")
        # a previous run's leftovers first, then what other pods hold now: the proof uses only the free slices
        ctx.kube.delete("pod", [proof_pod_name(plan.node, str(i)) for i in range(slices + 1)] + [two], TEST_NAMESPACE)
        used, room = self._in_use(ctx, plan)
        free = slices - used
        if free <= 0:
            return True, (f"skipped: every slice is in use ({used} of {slices} {res} held by other pods); the proof "
                          "runs when some are free")
        if room is not None and room < free + 1:
            return True, (f"skipped: the node has room for {room} more pod(s) (the kubelet's maxPods), the proof "
                          f"needs {free + 1}; docs/sharing.md (pods per node)")
        names = [proof_pod_name(plan.node, str(i)) for i in range(free + 1)]
        try:
            ctx.kube.apply("---\n".join(self._proof_pod(ctx, n, plan.node, {res: 1}) for n in names))

            def settled(pods: dict[str, state.PodState]) -> bool:
                bound = [p for p in pods.values() if p.phase == "Running"]
                return len(bound) >= free and any(p.unschedulable for p in pods.values())

            pods = self._wait(ctx, names, settled)
            bound = sorted(p.name for p in pods.values() if p.phase == "Running")
            pending = [p for p in pods.values() if p.unschedulable]
            if len(bound) != free or len(pending) != 1 or f"Insufficient {res}" not in pending[0].unschedulable:
                return False, (f"sharing proof: {len(bound)} of {free} one-slice pods bound, "
                               f"{len(pending)} Pending" + (f" ({pending[0].unschedulable})" if pending else "")
                               + f"; wanted {free} bound and 1 Pending with Insufficient {res}")
        finally:
            ctx.kube.delete("pod", names, TEST_NAMESPACE)
        proof = (f"{free} one-slice pods bound" + (f" ({used} of {slices} slices in use by other pods)" if used else "")
                 + f", 1 more Pending (Insufficient {res})")
        if plan.plugin is None or not plan.plugin.fail_requests_greater_than_one:
            return True, proof
        if free < 2:  # a pod asking for 2 would stay Pending, never reach the plugin
            return True, proof + "; the pod asking for 2 skipped (fewer than 2 slices free)"
        try:
            ctx.kube.apply(self._proof_pod(ctx, two, plan.node, {res: 2}))
            pod = self._wait(ctx, [two], lambda p: two in p and p[two].phase in ("Failed", "Running", "Succeeded")
                             ).get(two)
        finally:
            ctx.kube.delete("pod", [two], TEST_NAMESPACE)
        if pod is None or pod.reason != "UnexpectedAdmissionError":
            got = f"{pod.phase} {pod.reason}".strip() if pod else "not found"
            return False, (f"sharing proof: a pod asking for 2 {res} was {got}, not rejected by the device plugin "
                           "(failRequestsGreaterThanOne: UnexpectedAdmissionError)")
        return True, proof + f"; a pod asking for 2 rejected: {pod.reason} ({pod.message})"

    @staticmethod
    def _in_use(ctx: Context, plan: GPUPlan) -> tuple[int, int | None]:
        """(slices of the plan's resource other pods hold on the node, how many more pods the node takes: its
        allocatable pods, the kubelet's maxPods, less the pods bound to it; None when the node does not say)."""
        pods = ctx.kube.get("pods", namespace="*", field_selector=on_node(plan.node))  # that node's, not done
        held = allocation.holding_pods(pods).get(plan.node, [])
        used = sum(req.get(plan.resource_name, 0) for _p, req in held)
        found = ctx.kube.get("nodes", plan.node)
        limit = state.node_state(found[0]).allocatable_of("pods") if found else 0
        if not limit:
            return used, None
        bound = sum(1 for p in state.pod_states(pods)
                    if p.node == plan.node and p.phase not in allocation.DONE_PHASES)
        return used, max(limit - bound, 0)

    @staticmethod
    def _settle(ctx: Context) -> None:
        """Wait, up to the test pod timeout, until each node whose sharing labels the gpu phase changed in this
        run advertises its plan: config-manager applies a new config label a while later (the ConfigMap volume
        and the plugin's restart), and judging at once would report gpu.sharing-not-applied."""
        waiting = {n for n in ctx.relabelled if n in ctx.plans and ctx.plans[n].resources}

        def settled() -> tuple[bool, None]:
            nodes = state.by_name(ctx.kube.get("nodes"))
            for n in sorted(waiting):
                try:
                    ns = state.node_state(nodes[n]) if n in nodes else None
                except StateError:
                    ns = None
                # not Ready (or gone): no use waiting, its check says why
                if ns is None or not ns.ready or all(ns.allocatable_of(r) == v
                                                     for r, v in ctx.plans[n].resources.items()):
                    waiting.discard(n)
            return not waiting, None

        if waiting:
            until(settled, ctx.options.test_pod_timeout, POLL_S)

    def _hami_proof(self, ctx: Context, plan: GPUPlan) -> tuple[bool, str]:
        mem = min(4096, (plan.gpu_memory_mib or 8192) // 2)
        name = proof_pod_name(plan.node, "mem")
        ctx.kube.delete("pod", [name], TEST_NAMESPACE)
        try:
            ctx.kube.apply(self._proof_pod(ctx, name, plan.node, {GPU_RESOURCE: 1, HAMI_MEMORY: mem,
                                                                  HAMI_CORES: 10}, hami=True))
            pod = self._wait(ctx, [name], lambda p: name in p and (p[name].phase in ("Running", "Failed")
                                                                     or bool(p[name].unschedulable))).get(name)
        finally:
            ctx.kube.delete("pod", [name], TEST_NAMESPACE)
        if pod is None or pod.phase != "Running" or not pod.node:
            why = (pod.unschedulable or f"{pod.phase} {pod.reason}".strip()) if pod else "not found"
            return False, (f"sharing proof: a pod asking for {mem} MiB of {HAMI_MEMORY} through hami-scheduler was "
                           f"not bound ({why or 'Pending: no scheduler bound it'})")
        return True, f"a pod asking for {mem} MiB {HAMI_MEMORY} bound by hami-scheduler"

    def test_pods(self, ctx: Context, checks: list[NodeCheck]) -> None:
        """One pod per GPU node, all applied at once and polled together: a few kubectl calls in all."""
        if not checks:
            return
        for c in checks:
            c.pod = test_pod_name(c.node)
        waiting = {c.pod: c for c in checks}
        docs = {c.pod: self._pod(ctx, c.node) for c in checks}  # pod name -> its manifest
        dra_checks = [c for c in checks if ctx.plans[c.node].dra]
        templates = sorted({dra_class(ctx.plans[c.node]) for c in dra_checks})
        if extended_mapping(ctx):
            for c in dra_checks:
                if dra_class(ctx.plans[c.node]) != "gpu":
                    continue  # extendedResourceName is gpu.nvidia.com's: whole GPUs only
                waiting[extended_pod_name(c.node)] = c
                docs[extended_pod_name(c.node)] = self._extended_pod(ctx, c.node)
        # the names verify creates in default, read first: one that exists and that gpuk8s did not create (a user's
        # pod or ResourceClaimTemplate of that name) is neither deleted nor overwritten, and its node is not tested
        foreign = foreign_names(ctx, [("Pod", n, TEST_NAMESPACE) for n in waiting]
                                + [("ResourceClaimTemplate", claim_template_name(k), TEST_NAMESPACE)
                                   for k in templates])
        for name, c in list(waiting.items()):
            tpl = claim_template_name(dra_class(ctx.plans[c.node])) if ctx.plans[c.node].dra else ""
            taken = [n for n in (name, tpl) if n in foreign]
            if taken:
                if c.ok:
                    name_taken(c, "not tested", taken)
                del waiting[name]
        templates = [k for k in templates if claim_template_name(k) not in foreign]
        if not waiting:
            return
        names = list(waiting)
        ctx.kube.delete("pod", names, TEST_NAMESPACE)
        ctx.kube.apply("---\n".join([self._claim_template(k) for k in templates] + [docs[n] for n in names]))
        timeout = ctx.options.test_pod_timeout
        last: dict[str, str] = {}

        def judged() -> tuple[bool, None]:
            pods = {p.name: p for p in state.pod_states(ctx.kube.get("pods", namespace=TEST_NAMESPACE))}
            for name, c in list(waiting.items()):
                last[name] = state.pod_progress(pods.get(name))
                verdict = state.test_pod_verdict(pods.get(name))
                if verdict is None:
                    continue
                if c.ok:  # a dra node's second pod: the first failure is the verdict
                    c.ok, c.cause = verdict
                    c.cause_id = verdict.cause_id
                del waiting[name]
            return not waiting, None

        try:
            until(judged, timeout, 2)
            for name, c in waiting.items():
                if c.ok:
                    c.ok, c.cause = False, f"the test pod {name} did not finish within {timeout:g} s ({last[name]})"
                    c.cause_id = "gpu.test-pod-timeout"
        finally:
            ctx.kube.delete("pod", names, TEST_NAMESPACE)
            if templates:
                ctx.kube.delete("resourceclaimtemplate", [claim_template_name(k) for k in templates], TEST_NAMESPACE)
