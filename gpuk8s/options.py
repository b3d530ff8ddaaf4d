"""Command-line options shared by several commands."""

from enum import Enum

import typer


class Output(str, Enum):
    table = "table"
    json = "json"


InventoryOpt = typer.Option(
    None, "-i", "--inventory", help="Inventory file (default: $GPUK8S_INVENTORY, then ./inventory.yaml)."
)
OutputOpt = typer.Option(Output.table, "--output", "-o", help="table for people, json for scripts.")
# kubeadm's phase selection, for install and upgrade (the phase names: `--dry-run` lists them)
SkipPhasesOpt = typer.Option([], "--skip-phases", help="Phases to leave out, by name, comma-separated or repeated "
                             "(as kubeadm's --skip-phases); the cluster lock is always taken.")
OnlyPhaseOpt = typer.Option(None, "--only-phase", help="Run this phase alone (after the cluster lock); install's "
                            "prepare still reads every host (nothing applied) when it is left out.")


# install, join and upgrade from an air-gapped bundle (docs/airgap.md)
BundleOpt = typer.Option(None, "--bundle", help="Install from this bundle file (gpuk8s bundle create): it is "
                         "verified here, copied to a serving host and served for the run; no host reaches out.")
BundleHostOpt = typer.Option(None, "--bundle-host", help="The host that serves the bundle (default: the first "
                             "control plane).")
BundleKeyOpt = typer.Option(None, "--bundle-key", help="The builder's public key: the bundle must carry a good "
                            "signature by it (FILE.asc beside it, bundle create --sign-with).")
BundlePortOpt = typer.Option(5480, "--bundle-port", min=1024, max=65535, help="The port it is served on.")
KeepServingOpt = typer.Option(False, "--keep-serving", help="Keep serving the bundle after the run, and leave every "
                              "host's package sources and registry mirrors pointing at it, until the next run from "
                              "a bundle (or rm /var/lib/gpuk8s/bundle/serving on the serving host).")


def phase_names(values: list[str]) -> list[str]:
    """--skip-phases a,b --skip-phases c -> [a, b, c]."""
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


# The node-by-node commands (upgrade, driver upgrade): how many nodes at a time, how long for GPU pods and drains
MaxUnavailableOpt = typer.Option(1, "--max-unavailable", min=1, max=512,
                                 help="Nodes drained and upgraded at the same time.")
GpuPodTimeoutOpt = typer.Option(3600, "--gpu-pod-timeout", min=0,
                                help="Seconds to wait for a node's GPU pods to finish before its drain; past it the "
                                "node is left as it was and the upgrade stops.")
DrainTimeoutOpt = typer.Option(600, "--drain-timeout", min=1, help="Seconds for kubectl drain.")
