"""`gpuk8s versions`: the version matrix (gpuk8s/data/versions.yaml) as tables or JSON; no inventory, no host."""

from __future__ import annotations

from typing import Any

import typer

from gpuk8s import ui, versions
from gpuk8s.options import Output, OutputOpt


def register(app: typer.Typer, load_inventory: Any) -> None:
    @app.command(name="versions")
    def versions_cmd(output: Output = OutputOpt) -> None:
        """Print the Kubernetes minors gpuk8s installs, what it installs with each, and which are past end of life."""
        show(output)


def show(output: Output) -> None:
    day = versions.today()
    if output == Output.json:
        ui.emit_json(versions.to_json(day))
        return
    m = versions.matrix()
    rows, styles = [], []
    for k in m.minors.values():
        eol = k.end_of_life_reached(day)
        status = "END OF LIFE" if eol else "supported"
        if k.minor == m.default:
            status += ", default"
        rows.append([k.minor, k.latest_patch, k.end_of_life.isoformat(), status, k.kubeadm_api.rsplit("/", 1)[1],
                     f">= {k.containerd_floor}", ", ".join(t + "+" for t in k.containerd_tested) or "-",
                     k.pins.name])
        styles.append("yellow" if eol else "bold" if k.minor == m.default else "")
    ui.table(f"Kubernetes minors (the matrix was checked on {m.checked.isoformat()}; today is {day.isoformat()})",
             ["minor", "latest patch", "end of life", "status", "kubeadm API", "containerd",
              "containerd recommends", "pins"], rows, styles)
    used: dict[str, list[str]] = {}
    for k in m.minors.values():
        used.setdefault(k.pins.name, []).append(k.minor)
    ui.table("Pins (install.* in the inventory overrides each)",
             ["pins", "for minors", "device plugin", "container toolkit", "Calico", "Flannel", "DCGM exporter"],
             [[p.name, ", ".join(used[p.name]), p.device_plugin, p.toolkit, p.calico.version, p.flannel.version,
               p.dcgm_exporter] for p in m.pin_sets().values()])
    ui.table("GPU test images (the first one the node's driver can run)", ["image"],
             [[img] for img in m.cuda_test_images])
    con = ui.console()
    gone = versions.end_of_life_minors(day)
    ui.say(con, f"default: Kubernetes {m.default} (cluster.kubernetes_version chooses another minor of the table)")
    if gone:
        ui.say(con, "past end of life (installed with the preflight warning k8s.version-eol): "
                    + ", ".join(f"{k.minor} ({k.end_of_life.isoformat()})" for k in gone))
