"""`gpuk8s bundle verify FILE [-i INVENTORY]`: an air-gapped bundle's integrity (docs/airgap.md): the manifest first,
every file's sha256 and size against it, no member that is not a plain file or directory, within the caps of
gpuk8s/bundle/archive.py; with an inventory, whether it covers every host (gpuk8s/bundle/coverage.py). Exit 0
when the bundle is whole (and covers every host); 1 naming what differs or is missing, or why the file is no
bundle."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import typer

from gpuk8s import ui
from gpuk8s.bundle import create as build
from gpuk8s.bundle import signature
from gpuk8s.bundle.archive import BundleError
from gpuk8s.bundle.coverage import Gap, gaps, managed_branch, rpm_family
from gpuk8s.bundle.manifest import ManifestError
from gpuk8s.bundle.verify import Verified, verify
from gpuk8s.commands.common import failed, passwords
from gpuk8s.errors import GpuK8sError
from gpuk8s.exitcodes import ExitCode
from gpuk8s.options import Output, OutputOpt
from gpuk8s.preflight.runner import run_preflight


def register(app: typer.Typer, load_inventory: Any) -> None:
    bundle_app = typer.Typer(help="Air-gapped bundles: everything a site's hosts need in one file (docs/airgap.md).",
                             no_args_is_help=True)
    app.add_typer(bundle_app, name="bundle")

    @bundle_app.command(name="create")
    def create_cmd(
        inventory: Path = typer.Option(..., "--inventory", "-i", help="The site's inventory: its versions, pins "
                                       "and sources, and its hosts (read over SSH for their OS and architecture "
                                       "where this machine reaches them)."),
        out: Path | None = typer.Argument(None, metavar="FILE", help="Where to write the bundle (default: "  # noqa: UP007
                                          "gpuk8s-bundle-VERSION.tar.zst here)."),
        target: list[str] = typer.Option([], "--target", help="A kind of host to build for, that this machine "
                                         "cannot reach: OS-RELEASE/ARCH (ubuntu-22.04/x86_64), with /KERNEL (uname "
                                         "-r) for the driver's modules of such Ubuntu hosts whose driver gpuk8s "
                                         "manages; repeatable."),
        no_hosts: bool = typer.Option(False, "--no-hosts", help="Contact no host: build for the --target kinds "
                                      "only."),
        level: int = typer.Option(19, "--level", min=1, max=19, help="zstd's compression level."),
        driver_branch: list[str] = typer.Option([], "--driver-branch", help="Another driver branch to carry for "
                                                "the managed-driver Alibaba Cloud Linux hosts (a later `driver "
                                                "upgrade --bundle` to it); repeatable."),
        ubuntu_keyring: Path = typer.Option(Path(build.UBUNTU_KEYRING), "--ubuntu-keyring", help="Ubuntu's "
                                            "archive keys, to verify its Release where the bundle carries Ubuntu's "
                                            "driver packages (Debian: apt-get install ubuntu-keyring)."),
        sign_with: str | None = typer.Option(None, "--sign-with", help="Sign the bundle with this gpg secret "  # noqa: UP007
                                             "key of this machine (FILE.asc beside it; the site checks it with "
                                             "--bundle-key)."),
        output: Output = OutputOpt,
    ) -> None:
        """Build one bundle file with everything the inventory's hosts need to install without the internet:
        packages (their repositories' signatures kept), every image, the CNI manifest, an SBOM (docs/airgap.md)."""
        inv = load_inventory(inventory, output)
        facts: dict[str, Any] = {}
        try:
            # --target's syntax first, before any host is contacted; its driver branches once the hosts are read
            runtime = inv.cluster.container_runtime
            for t in target:
                build.parse_target(t, runtime)
            if not no_hosts:
                rep = run_preflight(inv, concurrency=16, ignore=set(), sudo_passwords=passwords(inv),
                                    measure_network=False)
                facts = {h.host.name: h.facts for h in rep.hosts}
            branches = build.branches_of(inv, facts)
            declared = [build.parse_target(t, runtime, branches=branches, inv=inv, facts=facts) for t in target]
            targets = build.with_branches(build.merge([*build.targets_from(inv, facts), *declared]),
                                          tuple(driver_branch))
            con = ui.console(stderr=True)  # progress: stdout is the result's (JSON with -o json)
            for name, f in facts.items():
                if f is None:
                    ui.say(con, f"{name}: not reached; its kind of host is built only if --target names it"
                                + (" (an Ubuntu host's driver only with its kernel: --target OS/ARCH/KERNEL)"
                                   if managed_branch(inv.host(name)) else ""), style="yellow")
            dest = out or Path(f"gpuk8s-bundle-{inv.cluster.kubernetes_version}.tar.zst")
            with tempfile.TemporaryDirectory(prefix=".gpuk8s-bundle-", dir=dest.resolve().parent) as tmp:
                made = build.create(inv, targets, dest, Path(tmp), say=lambda s: ui.say(con, s) if output !=
                                    Output.json else None, level=level, ubuntu_keyring=str(ubuntu_keyring.resolve()))
            if sign_with:
                made.signature = signature.sign(dest, sign_with)
        except (BundleError, ManifestError, build.SourceError, GpuK8sError) as e:
            failed(e, output)
        except (subprocess.SubprocessError, OSError) as e:  # a tool this machine runs (gpg, zstd, skopeo) failed
            failed(GpuK8sError(f"bundle create stopped: {type(e).__name__}: {str(e)[:300]}",
                               "check the tools it names (gpg, gpgv, zstd, skopeo) and the disk"), output)
        found = gaps(made.manifest, inv, facts) if facts else None
        show_created(made, found, output)
        raise typer.Exit(ExitCode.OK)

    @bundle_app.command(name="verify")
    def verify_cmd(
        file: Path = typer.Argument(..., help="The bundle file (.tar.zst)."),
        inventory: Path | None = typer.Option(None, "--inventory", "-i", help="Also check that the bundle covers "  # noqa: UP007
                                              "this inventory's hosts (their OS, architecture, kernel and driver "
                                              "branch, read over SSH as preflight reads them)."),
        key: Path | None = typer.Option(None, "--key", help="The builder's public key: the bundle must carry a "  # noqa: UP007
                                        "good signature by it (FILE.asc beside it)."),
        output: Output = OutputOpt,
    ) -> None:
        """Check a bundle before it is used: its manifest, every file's sha256 and size against it, with --key its
        signature, and with -i whether it serves every host of the inventory."""
        inv = load_inventory(inventory, output) if inventory is not None else None  # before reading a large file
        try:
            signer = signature.check(file, key) if key is not None else None
            v = verify(file)
        except (BundleError, ManifestError, signature.SignatureError) as e:
            failed(e, output)
        found: list[Gap] | None = None
        if inv is not None:
            rep = run_preflight(inv, concurrency=16, ignore=set(), sudo_passwords=passwords(inv),
                                measure_network=False)
            found = gaps(v.manifest, inv, {h.host.name: h.facts for h in rep.hosts})
        if signer and output != Output.json:
            ui.say(ui.console(), f"signed by {signer} ({key})")
        show(file, v, found, output)
        raise typer.Exit(ExitCode.OK if v.ok and not found else ExitCode.FAILED)


def created_json(made: build.Created, found: list[Gap] | None) -> dict[str, Any]:
    m = made.manifest
    return {"ok": True, "file": str(made.path), "signature": str(made.signature) if made.signature else None,
            "bytes": made.bytes, "seconds": round(made.seconds, 1),
            "kubernetes": m.kubernetes, "targets": m.to_json()["targets"], "images": made.images,
            "files": len(m.files), "os_packages": made.os_packages, "wheels": made.wheels,
            "wheels_not_carried": made.no_wheels,
            "coverage": None if found is None else [g.to_json() for g in found]}


def show_created(made: build.Created, found: list[Gap] | None, output: Output) -> None:
    if output == Output.json:
        ui.emit_json(created_json(made, found))
        return
    con = ui.console()
    m = made.manifest
    ui.say(con, f"{made.path}: {made.bytes} bytes, {len(m.files)} files, {made.images} image(s), Kubernetes "
                f"{m.kubernetes}, built in {made.seconds:.1f} s")
    for label, names in made.os_packages.items():
        if names:
            ui.say(con, f"{label}: from the distribution's own repository (not in the bundle; every host of it "
                        f"has them or its OS mirror serves them): {', '.join(names)}")
    if made.wheels:
        ui.say(con, f"gpuk8s: {made.wheels} wheel(s) in wheel/ (gpuk8s and what it requires, for this machine's "
                    "Python and platform)")
    for why in made.no_wheels:
        ui.say(con, f"wheel not carried: {why}", style="yellow")
    for g in found or []:
        ui.say(con, f"not covered: {g.message}", style="yellow")
    ui.say(con, f"next: copy it to the site, then gpuk8s bundle verify {made.path} -i INVENTORY there")


def to_json(file: Path, v: Verified, found: list[Gap] | None) -> dict[str, Any]:
    m = v.manifest
    return {"ok": v.ok and not found, "file": str(file), "kubernetes": m.kubernetes, "created_by": m.created_by,
            "targets": m.to_json()["targets"], "images": len(m.images), "files": v.files, "bytes": v.bytes,
            "problems": v.problems, "more_problems": v.more,
            "coverage": None if found is None else [g.to_json() for g in found]}


def show(file: Path, v: Verified, found: list[Gap] | None, output: Output) -> None:
    if output == Output.json:
        ui.emit_json(to_json(file, v, found))
        return
    m = v.manifest
    ui.table(f"Bundle {file}: Kubernetes {m.kubernetes}, made by {m.created_by}",
             ["os", "arch", "runtime", "kernels", "driver branches"],
             [[t.os, t.arch, t.runtime,
               ", ".join(t.kernels) or ("any (DKMS)" if rpm_family(t.os) and t.driver_branches else "-"),
               ", ".join(t.driver_branches) or "-"] for t in m.targets])
    con = ui.console()
    for g in found or []:
        ui.say(con, f"not covered: {g.message}", style="red")
    if found == []:
        ui.say(con, "covers every host of the inventory")
    if v.ok:
        ui.say(con, f"whole: {v.files} file(s), {v.bytes} bytes, {len(m.images)} image(s), every sha256 as its "
                    "manifest says")
        return
    for p in v.problems:
        ui.say(con, p, style="red")
    if v.more:
        ui.say(con, f"... and {v.more} more", style="red")
    ui.say(con, "the bundle is not whole: copy it again from where it was built (gpuk8s bundle verify there "
                "first), and do not install from this copy")
