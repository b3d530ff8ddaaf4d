"""`gpuk8s doctor [POD | node/NAME] [--all] [--fix]`: why a GPU pod is Pending or failing, why a GPU node lacks its
GPUs. Reads the cluster through the kube client seam and each node concerned over SSH (one round trip), names the
causes (gpuk8s/doctor/classify.py) as findings with evidence and a remedy; exit 0 when nothing is wrong, 1 when a
cause was found. `--fix` re-runs the install phases that remedy what gpuk8s knows how to fix (node preparation:
the runtime default; gpu: the device plugin's manifests and config, the node's labels), shown first and asked."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from gpuk8s import ui
from gpuk8s.commands.common import connect, passwords
from gpuk8s.doctor import classify
from gpuk8s.doctor.diagnose import Diagnosis, diagnose
from gpuk8s.doctor.fixes import apply_fixes, fix_targets
from gpuk8s.exitcodes import ExitCode
from gpuk8s.kube import state
from gpuk8s.kube.client import KubeError
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.report import doctor as report
from gpuk8s.report.cluster import phase_printer

# After a fix, a restarted plugin registers and a relabelled node's plugin reloads its config within seconds:
# the diagnosis is taken again, for at most this long, while a node that was fixed still shows a cause.
SETTLE_S = 60.0
SETTLE_EVERY_S = 5.0


def _unsettled(d: Diagnosis, fixed: set[str]) -> bool:
    """A node that was fixed still shows a cause a fix acts on (a pod's cause, such as a pod started without the
    nvidia runtime, stays until the pod is made again: not waited for)."""
    return any(f.subject is not None and f.subject.kind == "node" and f.subject.name in fixed
               and classify.fixable(f, d.ev) for f in d.findings)


def settle(d: Diagnosis, again: Callable[[], Diagnosis], fixed: set[str], timeout: float = SETTLE_S,
           every: float = SETTLE_EVERY_S, say: Callable[[str], None] = lambda _: None) -> Diagnosis:
    """The diagnosis once the fixed nodes show no cause a fix acts on, or the last one taken when `timeout` ran
    out (or when taking it again failed)."""
    if not _unsettled(d, fixed):
        return d
    say(f"waiting up to {timeout:.0f} s for {', '.join(sorted(fixed))} to settle")
    deadline = time.monotonic() + timeout
    while _unsettled(d, fixed) and time.monotonic() + every < deadline:
        time.sleep(every)
        try:
            d = again()
        except typer.Exit:
            break
    return d


def _describe(targets: dict[str, set[str]]) -> list[str]:
    what = {"prepare": "re-run node preparation (runtime default, container toolkit; the device plugin restarted "
                       "where the runtime is reconfigured) on",
            "gpu": "re-run the gpu phase (device plugin manifests and config, node labels) for",
            "plugin": "restart the device plugin pod on"}
    order = sorted(targets.items(), key=lambda kv: list(what).index(kv[0]))
    return [f"{what[p]} {', '.join(sorted(ns))}" for p, ns in order]


def register(app: typer.Typer, load_inventory: Any) -> None:
    @app.command()
    def doctor(
        target: str | None = typer.Argument(None, help="A pod (NAME or NAMESPACE/NAME) or node/NAME; default: every "  # noqa: UP007
                                            "Pending or failing GPU pod and every GPU node short of its plan."),
        every: bool = typer.Option(False, "--all", help="Look at every GPU pod and GPU node, not only those that "
                                   "look wrong."),
        fix: bool = typer.Option(False, "--fix", help="Apply the remedies gpuk8s knows how to apply safely (re-run "
                                 "node preparation or the gpu phase on the nodes concerned, restart a device plugin "
                                 "pod); shown first and asked."),
        yes: bool = typer.Option(False, "--yes", "-y", help="With --fix: do not ask."),
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        kubeconfig: Path | None = typer.Option(  # noqa: UP007
            None, "--kubeconfig", help="Use this machine's kubectl with this kubeconfig instead of kubectl on the "
            "first control plane; hosts are then not read over SSH."),
        context: str | None = typer.Option(None, "--context", help="The kubeconfig context (with --kubeconfig)."),  # noqa: UP007
    ) -> None:
        """Why a GPU pod is Pending or failing, why a GPU node lacks its GPUs: causes with evidence and remedies
        (docs/troubleshooting.md)."""
        inv = load_inventory(inventory, output)
        err = ui.console(stderr=True)
        sudo = passwords(inv) if kubeconfig is None else {}

        def run() -> Diagnosis:
            cluster = connect(inv, kubeconfig, context, sudo)
            try:
                return diagnose(inv, cluster.kube, target, every, kubeconfig is None, sudo)
            except LookupError as e:
                ui.say(err, str(e))
                raise typer.Exit(ExitCode.USAGE) from None
            except (KubeError, state.StateError) as e:
                ui.say(err, f"cannot read the cluster: {e}")
                raise typer.Exit(ExitCode.FAILED) from None
            finally:
                cluster.close()

        d = run()
        fixes: list[dict[str, Any]] = []
        if fix and d.findings:
            targets = fix_targets(d)
            if not targets:
                ui.say(err, "none of these causes is one gpuk8s can fix by itself: see each remedy")
            elif kubeconfig is not None:
                ui.say(err, "--fix re-runs install phases over SSH: leave out --kubeconfig")
            else:
                plan = _describe(targets)
                ui.say(err, "gpuk8s doctor --fix would:\n" + "\n".join(f"  {line}" for line in plan))
                if not yes:
                    if not sys.stdin.isatty():
                        ui.say(err, "not applied: pass --yes to apply without a prompt")
                        report.render(d, output, fixes)
                        raise typer.Exit(ExitCode.FAILED)
                    if not typer.confirm("apply?", default=False, err=True):
                        raise typer.Exit(ExitCode.FAILED)
                results = apply_fixes(inv, targets, sudo, phase_printer(output))
                fixes = [r.to_json() for r in results]
                d = run()  # what is left after the fix
                if all(r.status != "failed" for r in results) and any(r.status == "changed" for r in results):
                    d = settle(d, run, {n for ns in targets.values() for n in ns}, say=lambda m: ui.say(err, m))
        report.render(d, output, fixes)
        raise typer.Exit(ExitCode.FAILED if d.findings else ExitCode.OK)
