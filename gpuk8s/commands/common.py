"""What the host-contacting commands share: --ignore validation, sudo passwords, this machine's kubectl for
--kubeconfig, the cluster connection of the commands that only read it, usage errors, and finishing with a
report."""

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.text import Text

from gpuk8s import ui
from gpuk8s.bundle import signature
from gpuk8s.bundle.site import BundleFile, bundle_file
from gpuk8s.bundle.verify import verify
from gpuk8s.credentials import CredentialError, sudo_passwords
from gpuk8s.errors import GpuK8sError
from gpuk8s.exitcodes import ExitCode
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube.client import KubeClient, KubeError, LocalKubectl, SSHKubectl
from gpuk8s.options import Output
from gpuk8s.preflight.result import CHECKS
from gpuk8s.remote import RemoteError, Session


def ignored_checks(inv: Inventory, ignore: Iterable[str]) -> set[str]:
    """--ignore plus the inventory's preflight.ignore; an unknown id is a usage error (exit 2)."""
    ignored = set(ignore) | set(inv.preflight.ignore)
    unknown = sorted(i for i in ignored if i != "all" and i not in CHECKS)
    if unknown:
        ui.say(ui.console(stderr=True), f"unknown check id(s) for --ignore: {', '.join(unknown)}; "
                                        f"known: {', '.join(CHECKS)}")
        raise typer.Exit(ExitCode.USAGE)
    return ignored


def passwords(inv: Inventory) -> dict[str, str]:
    """The sudo passwords the inventory asks for (environment or prompt); a missing one is exit 2."""
    try:
        return sudo_passwords(inv)
    except CredentialError as e:
        ui.say(ui.console(stderr=True), e)
        raise typer.Exit(ExitCode.USAGE) from None


def local_kubectl(kubeconfig: Path, context: str | None = None) -> LocalKubectl:
    """This machine's kubectl with --kubeconfig (and --context); when it cannot be used (no kubectl in PATH),
    the reason and its remedy on stderr and exit 2 (usage)."""
    try:
        return LocalKubectl(str(kubeconfig), context)
    except KubeError as e:
        ui.say(ui.console(stderr=True), f"{e.message}; {e.remedy}")
        raise typer.Exit(ExitCode.USAGE) from None


def confirm(dry_run: bool, yes: bool, what: str, question: str) -> None:
    """Ask before a command that drains or changes nodes: --yes (or --dry-run) skips it; without a terminal --yes
    must be given (exit 2, saying `what` the command does)."""
    if dry_run or yes:
        return
    if not sys.stdin.isatty():
        ui.say(ui.console(stderr=True), f"{what}: pass --yes (or look first with --dry-run)")
        raise typer.Exit(ExitCode.USAGE)
    if not typer.confirm(question, default=False):
        raise typer.Exit(ExitCode.USAGE)


def failed(e: GpuK8sError, output: Output) -> NoReturn:
    """A flow that could not start (an unreachable control plane): its message and remedy, exit 1."""
    if output == Output.json:
        ui.emit_json({"ok": False, "error": e.message, "remedy": e.remedy})
    else:
        ui.say(ui.console(stderr=True), f"{e.message}; {e.remedy}")
    raise typer.Exit(ExitCode.FAILED)


def load_bundle(file: Path | None, host: str | None, port: int, output: Output,
                key: Path | None = None, keep: bool = False) -> BundleFile | None:
    """--bundle: the file verified here (with --bundle-key, its signature first; then every member against its
    manifest) before any host is contacted; exit 1 naming what differs."""
    if file is None:
        if keep:
            usage_error(GpuK8sError("--keep-serving without --bundle: there is no bundle to serve",
                                    "add --bundle FILE, or leave --keep-serving out"), output)
        return None
    try:
        if key is not None:
            signature.check(file, key)
        v = verify(file)
    except GpuK8sError as e:
        failed(e, output)
    if not v.ok:
        failed(GpuK8sError(f"{file}: the bundle is not whole: " + "; ".join(v.problems[:5]),
                           "copy it again from where it was built (gpuk8s bundle verify there first)"), output)
    return bundle_file(file, v, host, port, keep)


def usage_error(e: GpuK8sError, output: Output) -> NoReturn:
    """A wrong command line found before any host is contacted: what and what to do, exit 2 (JSON with -o json)."""
    if output == Output.json:
        ui.emit_json({"ok": False, "error": e.message, "remedy": e.remedy, "kind": e.kind})
    else:
        ui.say(ui.console(stderr=True), f"{e.message}; {e.remedy}")
    raise typer.Exit(ExitCode.USAGE)


class HostProgress:
    """Live progress of a command that reads hosts (preflight, health): `[n/total] HOST: MARK (seconds)` on stderr as
    each host finishes, on a terminal only (-o table), never when piped or for -o json."""

    def __init__(self, total: int, output: Output) -> None:
        self.live = output == Output.table and ui.is_terminal()
        self.con = ui.console(stderr=True)
        self.total, self.done = total, 0

    def say(self, text: str) -> None:
        if self.live:
            ui.say(self.con, text)

    def host(self, name: str, ok: bool, mark: str, seconds: float) -> None:
        self.done += 1
        if self.live:
            self.con.print(Text.assemble(ui.safe(f"[{self.done}/{self.total}] {name}: "),
                                         ui.safe(mark, "green" if ok else "red"), f" ({seconds:.1f} s)"))


def finish(rep: Any, output: Output, render: Callable[[], None]) -> None:
    """JSON or the rendered tables, then exit 0 when the report is ok, else 1."""
    if output == Output.json:
        if hasattr(rep, "json_fields"):  # a report that writes its hosts one by one (preflight's)
            ui.emit_json_stream(rep.json_fields())
        else:
            ui.emit_json(rep.to_json())
    else:
        render()
    raise typer.Exit(ExitCode.OK if rep.ok else ExitCode.FAILED)


class Cluster:
    """The kube client for a command that only reads the cluster, and what it must close."""

    def __init__(self, kube: KubeClient, session: Session | None = None) -> None:
        self.kube = kube
        self.session = session

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


def connect(inv: Inventory, kubeconfig: Path | None, context: str | None,
            sudo: dict[str, str] | None = None) -> Cluster:
    """kubectl with --kubeconfig on this machine, else kubectl with admin.conf on the first control plane.
    Exits 2 (usage) when --kubeconfig needs a kubectl that is not there, 1 when the control plane is unreachable."""
    if kubeconfig is not None:
        return Cluster(local_kubectl(kubeconfig, context))
    cp = inv.control_planes[0]
    session = Session(cp, (sudo or {}).get(cp.name))
    try:
        session.connect()
    except RemoteError as e:
        ui.say(ui.console(stderr=True), f"cannot reach the cluster through {cp.name}: {e.message}; {e.remedy}")
        raise typer.Exit(ExitCode.FAILED) from None
    return Cluster(SSHKubectl(session), session)
