"""`gpuk8s join`, `gpuk8s verify` and `gpuk8s render`: growing, checking and showing the cluster."""

from pathlib import Path
from typing import Any

import typer

from gpuk8s import flows, gpuplan, localfiles, ui
from gpuk8s.commands.common import finish, ignored_checks, load_bundle, local_kubectl, passwords, usage_error
from gpuk8s.errors import GpuK8sError
from gpuk8s.exitcodes import ExitCode
from gpuk8s.kube import monitoring, render
from gpuk8s.options import (
    BundleHostOpt,
    BundleKeyOpt,
    BundleOpt,
    BundlePortOpt,
    InventoryOpt,
    KeepServingOpt,
    Output,
    OutputOpt,
    phase_names,
)
from gpuk8s.phases.base import Options, PhaseSelectionError
from gpuk8s.report.cluster import phase_printer, render_cluster


def register(app: typer.Typer, load_inventory: Any) -> None:
    @app.command()
    def join(
        hosts: list[str] = typer.Argument(None, help="Hosts of the inventory to join (default: every host not "
                                          "yet in the cluster)."),
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=512),
        ignore: list[str] = typer.Option([], "--ignore", help="Preflight check id that must not block a host."),
        test_pods: bool = typer.Option(True, "--test-pods/--no-test-pods"),
        allow_reboot: bool = typer.Option(False, "--allow-reboot", help="Reboot a host whose MIG change needs it, "
                                          "wait for SSH and continue (docs/mig.md)."),
        bundle: Path | None = BundleOpt,  # noqa: UP007
        bundle_host: str | None = BundleHostOpt,  # noqa: UP007
        bundle_port: int = BundlePortOpt,
        bundle_key: Path | None = BundleKeyOpt,  # noqa: UP007
        keep_serving: bool = KeepServingOpt,
    ) -> None:
        """Prepare and join hosts to the running cluster, with a fresh token minted on a control plane."""
        inv = load_inventory(inventory, output)
        served = load_bundle(bundle, bundle_host, bundle_port, output, bundle_key, keep_serving)
        sudo = passwords(inv)
        con = ui.console(stderr=True)
        unknown = [n for n in hosts or [] if n not in {h.name for h in inv.hosts}]
        if unknown:
            ui.say(con, f"not in the inventory: {', '.join(unknown)}")
            raise typer.Exit(ExitCode.USAGE)
        try:
            missing, unfinished = flows.not_joined(inv, sudo)
        except GpuK8sError as e:
            ui.say(con, f"cannot ask the cluster which hosts it has: {e.message}; {e.remedy}")
            raise typer.Exit(ExitCode.FAILED) from None
        wanted = [h for h in inv.hosts if h.name in set(hosts)] if hosts else [*missing, *unfinished]
        for h in wanted:
            if h in unfinished:
                ui.say(con, f"{h.name}: in the cluster without its GPU setup (a join stopped half-way): finishing it")
            elif h not in missing:
                ui.say(con, f"{h.name}: already in the cluster, skipped")
        targets = [h for h in wanted if (h in missing or h in unfinished) and h.name != inv.control_planes[0].name]
        if not targets:
            ui.say(con, "nothing to join: every named host is already in the cluster")
            if output == Output.json:
                ui.emit_json({"ok": True, "changed": False, "joined": []})
            raise typer.Exit(ExitCode.OK)
        rep = flows.join(inv, targets, concurrency=concurrency, ignore=ignored_checks(inv, ignore),
                         sudo_passwords=sudo, options=Options(test_pods=test_pods, allow_reboot=allow_reboot,
                                                              bundle=served),
                         emit=phase_printer(output))
        finish(rep, output, lambda: render_cluster(rep, "join"))

    @app.command()
    def verify(
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=512),
        test_pods: bool = typer.Option(True, "--test-pods/--no-test-pods"),
        kubeconfig: Path | None = typer.Option(  # noqa: UP007
            None, "--kubeconfig", help="Ask the cluster with this machine's kubectl and this kubeconfig instead of "
            "kubectl on the first control plane; no host is contacted over SSH."),
        context: str | None = typer.Option(None, "--context", help="The kubeconfig context (with --kubeconfig)."),  # noqa: UP007
        fabric: bool = typer.Option(False, "--fabric", help="Also prove the RDMA fabric of the nodes whose inventory "
                                    "sets fabric: NCCL all-reduce across each node's GPUs and RDMA write between "
                                    "nodes, against floors (docs/fabric.md)."),
        quarantine: bool = typer.Option(False, "--quarantine", help="With --fabric: taint the nodes it fails "
                                        "(gpuk8s.io/quarantine, as health does) and release those quarantined for "
                                        "their fabric that pass now."),
        skip_phases: list[str] = typer.Option([], "--skip-phases", help="Phases to leave out, by name, "
                                              "comma-separated or repeated: verify, monitoring-verify, fabric."),
    ) -> None:
        """Check that every node is Ready and every GPU the hosts have is schedulable (install's last phase)."""
        if quarantine and not fabric:
            ui.say(ui.console(stderr=True), "--quarantine goes with --fabric (health quarantines for GPU faults)")
            raise typer.Exit(ExitCode.USAGE)
        if fabric and kubeconfig is not None:
            ui.say(ui.console(stderr=True), "--fabric reads each host's RDMA ports over SSH: leave out --kubeconfig")
            raise typer.Exit(ExitCode.USAGE)
        inv = load_inventory(inventory, output)
        options = Options(test_pods=test_pods, fabric=fabric, fabric_quarantine=quarantine)
        skip = phase_names(skip_phases)
        try:  # a wrong phase name is told before any host is contacted
            flows.select_verify(inv, options, skip)
            if quarantine and "fabric" in skip:
                raise PhaseSelectionError("--quarantine with --skip-phases fabric: the fabric's tests decide what it "
                                          "taints and releases", "leave fabric out of --skip-phases, or --quarantine "
                                          "out of the command")
        except PhaseSelectionError as e:
            usage_error(e, output)
        kube = None if kubeconfig is None else local_kubectl(kubeconfig, context)
        rep = flows.verify(inv, concurrency=concurrency, sudo_passwords=passwords(inv) if kube is None else {},
                           options=options, emit=phase_printer(output), kube=kube, skip=skip)
        finish(rep, output, lambda: render_cluster(rep, "verify"))

    @app.command(name="render")
    def render_cmd(
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output_dir: Path | None = typer.Option(None, "--output-dir", help="Write one file per manifest there."),  # noqa: UP007
    ) -> None:
        """Print the kubeadm configurations and manifests gpuk8s would use (secrets as placeholders)."""
        inv = load_inventory(inventory, Output.table)
        docs = render.manifests(inv)
        docs.update(monitoring.rendered(inv, gpuplan.plans(inv)))  # with monitoring enabled
        if output_dir is not None:
            # as the kubeconfig is written: never through a link, in a directory no one else may write
            try:
                localfiles.write_into(output_dir, docs)
            except localfiles.LocalFileError as e:
                ui.say(ui.console(stderr=True), f"{e.message}; {e.remedy}")
                raise typer.Exit(ExitCode.FAILED) from None
            ui.say(ui.console(stderr=True), f"wrote {len(docs)} file(s) to {output_dir}")
            return
        for name, text in docs.items():
            print(f"---\n# {name}\n{text.rstrip()}")
