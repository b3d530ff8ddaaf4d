"""doctor --fix: which install phases remedy the causes found, and running them (node preparation: the runtime
default; gpu: the device plugin's manifests and config, the node's labels; a device plugin pod restarted). Above
the phases: the only part of doctor/ that changes a host or the cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuk8s.doctor import classify
from gpuk8s.doctor.diagnose import Diagnosis
from gpuk8s.findings import Finding
from gpuk8s.inventory.model import Inventory
from gpuk8s.phases.base import Context, Options, run_phases
from gpuk8s.phases.gather import gather
from gpuk8s.phases.gpu import GPUNodes, RestartPlugin
from gpuk8s.phases.lock import Lock
from gpuk8s.phases.prepare import Prepare
from gpuk8s.remote import Session


def fix_targets(d: Diagnosis) -> dict[str, set[str]]:
    """phase -> the hosts whose causes it remedies."""
    out: dict[str, set[str]] = {}
    for f in d.findings:
        phase = classify.fixable(f, d.ev)
        node = finding_node(d, f)
        if phase and node:
            out.setdefault(phase, set()).add(node)
    return out


def apply_fixes(inv: Inventory, targets: dict[str, set[str]], sudo: dict[str, str],
                emit: Callable[[str], None]) -> list[Any]:
    """Re-run prepare on the hosts that need it, then the gpu phase (manifests, labels) with every GPU node's plan
    from fresh facts; the results of each phase."""

    hosts = {h.name: h for h in inv.hosts}
    names = sorted({n for ns in targets.values() for n in ns})
    ctx = Context(inv, options=Options(only=[hosts[n] for n in names if n in hosts]), sudo_passwords=sudo,
                  emit=emit)
    results: list[Any] = []
    try:
        cp = inv.control_planes[0]
        ctx.sessions[cp.name] = Session(cp, sudo.get(cp.name))
        phases: list[Any] = [Lock()] + ([Prepare()] if "prepare" in targets else [])
        if run_phases(phases, ctx, results) and all(r.status != "failed" for r in results):
            gather(ctx, inv.hosts)  # every GPU node's plan from fresh facts (prepare may have changed them)
            if {"prepare", "gpu"} & set(targets):
                run_phases([GPUNodes()], ctx, results)
            left = set(targets.get("plugin", ())) - ctx.plugin_restarted
            if left:
                run_phases([RestartPlugin(sorted(left))], ctx, results)
    finally:
        ctx.close()
    return results


def finding_node(d: Diagnosis, f: Finding) -> str:
    if f.subject is None:
        return ""
    if f.subject.kind == "node":
        return f.subject.name
    ns, _, name = f.subject.name.partition("/")
    return str(((d.ev.pod(ns, name) or {}).get("spec") or {}).get("nodeName", "") or "")
