"""`gpuk8s images`: every container image the inventory's versions need, as gpuk8s will name them (the mirror's
names where `registry:` sets one), with where each is published: the list to copy into a mirror ahead of time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpuk8s import mirrors, ui
from gpuk8s.kube import images
from gpuk8s.options import InventoryOpt, Output, OutputOpt


def register(app: typer.Typer, load_inventory: Any) -> None:
    @app.command(name="images")
    def images_cmd(inventory: Path | None = InventoryOpt, output: Output = OutputOpt) -> None:  # noqa: UP007
        """List every image install and verify pull, for mirroring them ahead of time (docs/mirrors.md)."""
        inv = load_inventory(inventory, output)
        show(inv, output)


def to_json(inv: Any) -> dict[str, Any]:
    repo = mirrors.kubeadm_repository(inv) or mirrors.KUBEADM_REGISTRY
    version = images.kubeadm_images(inv)[0].upstream.rsplit(":", 1)[1]
    return {
        "mirror": inv.registry.mirror, "overrides": dict(inv.registry.overrides),
        "images": [{"image": n.image, "upstream": n.upstream, "used_by": n.used_by}
                   for n in images.needed_images(inv)],
        # pause, etcd and coredns: kubeadm's choice per release, listed by kubeadm itself
        "kubeadm_list": f"kubeadm config images list --kubernetes-version {version} "
                        f"--image-repository {repo}",
        "cni_manifest": mirrors.cni_manifest_url(inv),
    }


def show(inv: Any, output: Output) -> None:
    data = to_json(inv)
    if output == Output.json:
        ui.emit_json(data)
        return
    ui.table("Images (copy each from 'upstream' to 'image' before installing: skopeo copy docker://UPSTREAM "
             "docker://IMAGE)", ["image", "upstream", "used by"],
             [[i["image"], i["upstream"] if i["upstream"] != i["image"] else "-", i["used_by"]]
              for i in data["images"]])
    con = ui.console()
    ui.say(con, f"kubeadm's pause, etcd and coredns images: {data['kubeadm_list']} (kubeadm names them per "
                "release; the list includes the images above)")
    ui.say(con, f"CNI manifest: {data['cni_manifest']}")
