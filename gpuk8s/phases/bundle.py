"""Phase bundle (`--bundle FILE`): the bundle copied to its serving host, unpacked and served for the run; every
later phase reads the served inventory (gpuk8s/bundle/site.py), so that no host reaches out.

The copy goes once per bundle, and on from where it stopped when a run was cut (playbooks/cluster/bundle-*.sh);
the host checks it against the sha256 of the file gpuk8s verified here before anything of it is used. The server
(gpuk8s/data/bundle_serve.py) is held over gpuk8s's SSH connection, as the cluster lock is: it ends with the run,
also when gpuk8s is killed or loses the connection. Preflight then names every host the bundle does not cover
(bundle.coverage), before any change to it.

Every host's package sources and containerd's registry mirrors name the serving host for the run, and are put
back as they were when it ends (playbooks/cluster/bundle-sources.sh): the copies the last run from a bundle left
go in place first, so that a re-run's playbooks find nothing to change.
"""

from __future__ import annotations

import threading
import time
from importlib import resources

from gpuk8s.bundle.coverage import kubernetes_gaps
from gpuk8s.bundle.site import BundleFile, endpoint, served, source_files
from gpuk8s.inventory.model import Host
from gpuk8s.phases import shell
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult
from gpuk8s.phases.hostfiles import tail
from gpuk8s.remote import Held, RemoteError, Session, for_each_host

READY = "gpuk8s-bundle-serving"  # what the server prints once it listens (bundle_serve.py READY)
COPY_SECONDS_PER_GB = 60  # the copy's timeout: 1 GB a minute at least (a 10 Gbit/s link moves ~1 GB a second)


def server_source() -> str:
    return resources.files("gpuk8s.data").joinpath("bundle_serve.py").read_text()


class Bundle(Phase):
    name = "bundle"
    title = "serve the bundle to the hosts"

    def __init__(self, upgrade_to: str | None = None) -> None:
        self.held: Held | None = None
        # a connection of its own to the serving host: phases close a failed host's connection in ctx.sessions
        # (its driver failed, health held it back), and the server must outlive that for the other hosts
        self.session: Session | None = None
        self.upgrade_to = upgrade_to  # upgrade: the one minor the bundle must hold (the cluster runs another)
        # the hosts whose sources name the serving host until the run ends (prepare's threads add to it), those
        # whose sources could not be kept (host: why), and whether the run is putting them back (then: no more)
        self.pointed: dict[str, Host] = {}
        self.unkept: dict[str, str] = {}
        self.closed = False
        self.serving = ""  # the serving host's name
        self.files: list[str] = []  # the source files each host's sources are (decided once, on the served inventory)
        self.lock = threading.Lock()

    def _where(self, ctx: Context, b: BundleFile) -> Host:
        if b.host is None:
            return ctx.cp
        try:
            return ctx.inv.host(b.host)
        except KeyError:
            raise PhaseError(f"--bundle-host {b.host}: no such host in the inventory",
                             "name a host of the inventory (default: the first control plane)") from None

    def _decide(self, ctx: Context) -> tuple[BundleFile, Host]:
        b = ctx.options.bundle
        assert b is not None
        if self.upgrade_to is not None:
            if b.manifest.minor != self.upgrade_to:
                raise PhaseError(f"the bundle holds Kubernetes {b.manifest.kubernetes}; this upgrade goes to "
                                 f"{self.upgrade_to}", "upgrade one minor per bundle: --to the bundle's minor, "
                                 "or build a bundle for it (gpuk8s bundle create)")
            return b, self._where(ctx, b)
        gaps = kubernetes_gaps(b.manifest, ctx.inv)
        if gaps:
            raise PhaseError(gaps[0].message, "build a bundle for the inventory's version: gpuk8s bundle create")
        return b, self._where(ctx, b)

    def _serve(self, ctx: Context, b: BundleFile, host: Host) -> None:
        ctx.bundle = b.manifest
        ctx.inv = served(ctx.inv, b.manifest, host.address, b.port)

    def plan(self, ctx: Context) -> PhasePlan:
        b, host = self._decide(ctx)
        cmds = [Change(f"copy {b.path} ({b.size} bytes, sha256 {b.sha256}) to {host.name} where it is not whole "
                       "yet, from where an earlier copy stopped", host.name,
                       shell.command("bundle-append", sha256=b.sha256, offset=0)),
                Change(f"check it and unpack it into /var/lib/gpuk8s/bundle/{b.sha256}", host.name,
                       shell.command("bundle-unpack", sha256=b.sha256)),
                Change(f"serve it on http://{endpoint(host.address, b.port)} "
                       + ("after this run too (--keep-serving)" if b.keep else "until this run ends"), host.name,
                       f"bundle_serve.py /var/lib/gpuk8s/bundle/{b.sha256} {host.address} {b.port}"
                       + (" --while /var/lib/gpuk8s/bundle/serving" if b.keep else ""))]
        self._serve(ctx, b, host)
        files = source_files(ctx.inv)
        for h in ctx.inv.hosts:
            cmds.append(Change("point its package sources and registry mirrors at the bundle for the run (the "
                               "copies the last run from a bundle left), keeping them as they are now",
                               h.name, shell.command("bundle-sources", mode="in", files=files,
                                                     serving=h.name == host.name)))
            if not b.keep:
                cmds.append(Change("when the run ends: put them back as they were", h.name,
                                   shell.command("bundle-sources", mode="out", files=files, serving=False)))
        # nothing is served in a dry run: preflight would find the served sources unreachable on every host
        ctx.ignore = ctx.ignore | {"net.sources"}
        return self.planned("would-change", "every host installs from the bundle, nothing reaches out", cmds)

    def _session(self, ctx: Context, host: Host) -> Session:
        if self.session is None:
            self.session = Session(host, ctx.sudo_passwords.get(host.name))
        return self.session

    def run(self, ctx: Context) -> PhaseResult:
        b, host = self._decide(ctx)
        s = self._session(ctx, host)
        ctx.on_exit.append(self.release)  # its connection closed (and the server ended) whatever happens below
        start = time.monotonic()
        sent = 0
        try:
            res = s.run(shell.command("bundle-state", sha256=b.sha256, size=b.size), sudo=True,
                        display="the bundle's state")
            state = res.stdout.strip().split()
            if not res.ok or not state or state[0] not in ("unpacked", "part"):
                raise PhaseError(f"cannot read the bundle's state on {host.name}: {tail(res)}", "check the host")
            if state[0] == "part":
                # the host's answer is data: digits only, and no longer than a size can be
                have = int(state[1]) if len(state) > 1 and state[1].isdigit() and len(state[1]) <= 15 else -1
                if have < 0:
                    said = state[1][:20] if len(state) > 1 else "?"
                    raise PhaseError(f"the bundle's partial copy on {host.name} is not a part of it ({said} bytes)",
                                     f"remove /var/lib/gpuk8s/bundle/{b.sha256}.tar.zst.part there, then re-run")
                if 0 <= have < b.size:
                    ctx.emit(f"bundle: copying {b.size - have} bytes to {host.name}"
                             + (f" (from byte {have}: an earlier copy stopped there)" if have else ""))
                    with b.path.open("rb") as f:
                        f.seek(have)
                        res = s.send(shell.command("bundle-append", sha256=b.sha256, offset=have), f,
                                     display=f"copy the bundle to {host.name}",
                                     timeout=120 + COPY_SECONDS_PER_GB * (b.size - have) / 1e9)
                    if not res.ok:
                        raise PhaseError(f"the bundle could not be copied to {host.name}: {tail(res)}",
                                         "check the host's disk under /var/lib/gpuk8s; a re-run goes on from where "
                                         "the copy stopped")
                    sent = b.size - have
                res = s.run(shell.command("bundle-unpack", sha256=b.sha256), sudo=True, timeout=1800,
                            display="check and unpack the bundle")
                if not res.ok:
                    raise PhaseError(f"the bundle could not be unpacked on {host.name}: {tail(res)}",
                                     "check the host's disk under /var/lib/gpuk8s, then re-run")
            copied = time.monotonic() - start
        except RemoteError as e:
            raise PhaseError(f"the bundle cannot be copied to {host.name}: {e.message}", e.remedy) from None
        problem = self._start(s, b, host)
        if problem:
            raise PhaseError(problem, f"check that port {b.port} is free there (--bundle-port) and that it has python3")
        ctx.after_reboot.append(lambda h: self._again(ctx, b, host) if h.name == host.name else "")
        self._serve(ctx, b, host)
        self.serving = host.name
        self.files = source_files(ctx.inv)
        self._point(ctx)
        where = f"http://{endpoint(host.address, b.port)}"
        how = f"copied {sent} bytes in {copied:.1f} s, " if sent else ""
        kept = (f"; kept serving after the run, the hosts' sources with it, until the next run from a bundle (or "
                f"rm /var/lib/gpuk8s/bundle/serving on {host.name})" if b.keep else "")
        return self.result("changed", f"served from {host.name} at {where} ({how}Kubernetes {b.manifest.kubernetes})"
                           + kept)

    def _sources(self, ctx: Context, h: Host, s: Session | None, mode: str) -> str:
        """bundle-sources.sh `mode` on one host ("" when done, else why not); without `s`, on a connection of its
        own (a phase closed the host's: it failed)."""
        own = s is None
        try:
            if s is None:
                s = Session(h, ctx.sudo_passwords.get(h.name))
            res = s.run(shell.command("bundle-sources", mode=mode, files=self.files,
                                      serving=h.name == self.serving), sudo=True,
                        display="point its sources at the bundle" if mode == "in" else "put its sources back",
                        timeout=120)
            return "" if res.ok else tail(res)
        except RemoteError as e:
            return e.message
        finally:
            if own and s is not None:
                s.close()

    def _point(self, ctx: Context) -> None:
        """Every host's sources name the serving host until the run ends (then put back: on_exit): each host prepare
        reaches, before its steps run (over its connection: a host whose sources could not be kept is not
        prepared); now, those connected already and every other host of the inventory (join: the nodes pull too,
        as verify's test pods do), each over a connection of its own (one whose sources could not be kept is named
        when the run ends)."""
        keep = bool(ctx.options.bundle and ctx.options.bundle.keep)
        if not keep:  # registered first: a run stopped while hosts are pointed puts back those it pointed
            ctx.on_exit.append(lambda: self._put_back(ctx))

        def one(h: Host, s: Session | None) -> str:
            with self.lock:
                if self.closed:
                    return "the run is ending"
                if h.name in self.pointed or h.name in self.unkept:
                    return ""
                self.pointed[h.name] = h
            why = self._sources(ctx, h, s, "in")
            if why:
                with self.lock:
                    # not put back at the end: what `in` kept of it (if anything) stays for the next run
                    self.pointed.pop(h.name, None)
                    self.unkept[h.name] = why
            return why

        def before_steps(h: Host, s: Session) -> None:
            why = one(h, s)
            if why:
                raise RemoteError("bundle-sources", f"its package sources could not be kept to put back after the "
                                  f"run, so it was not prepared: {why}", "check /var/lib/gpuk8s on it, then re-run")

        prepared = ({ctx.cp.name, *(h.name for h in ctx.options.only)} if ctx.options.only is not None
                    else {h.name for h in ctx.inv.hosts})
        now = [h for h in ctx.inv.hosts if h.name in ctx.sessions or h.name not in prepared]
        for_each_host(now, lambda h: one(h, ctx.sessions.get(h.name)), ctx.concurrency)
        ctx.before_steps.append(before_steps)

    def _put_back(self, ctx: Context) -> None:
        with self.lock:
            self.closed = True  # a prepare thread still running points no host after this
            hosts, self.pointed = list(self.pointed.values()), {}
            unkept, self.unkept = dict(self.unkept), {}
        done = for_each_host(hosts, lambda h: self._sources(ctx, h, ctx.sessions.get(h.name), "out"),
                             ctx.concurrency) if hosts else {}
        failed = {n: (r if isinstance(r, str) else f"{type(r).__name__}: {r}") for n, r in done.items()
                  if not isinstance(r, str) or r}
        back = len(hosts) - len(failed)
        if back:
            ctx.emit(f"bundle: the package sources and registry mirrors of {back} host(s) are as they were before "
                     "the run")
        for name, why in sorted(failed.items()):
            ctx.emit(f"bundle: {name}: its sources still name the serving host ({why}); the next run from a "
                     "bundle puts them back")
        for name, why in sorted(unkept.items()):
            ctx.emit(f"bundle: {name}: its sources could not be kept before the run ({why}): not put back")

    def _start(self, s: Session, b: BundleFile, host: Host) -> str:
        """The server held on `s` (with b.keep, in the background on the host, until the next run from a bundle
        or the user ends it): "" once it listens, else why not."""
        command = shell.command("bundle-serve", sha256=b.sha256, address=host.address, port=b.port,
                                server=server_source(), keep=b.keep)
        display = f"serve the bundle on {host.name}"
        try:
            if b.keep:
                res = s.run(command, sudo=True, display=display, timeout=60)
                return "" if res.ok and READY in res.stdout.split() else \
                    f"the bundle server did not start on {host.name}: {tail(res)}"
            self.held, out = s.hold(command, until=READY, display=display)
        except RemoteError as e:
            return f"the bundle cannot be served from {host.name}: {e.message}"
        return "" if self.held is not None else f"the bundle server did not start on {host.name}: {out.strip()[-300:]}"

    def _again(self, ctx: Context, b: BundleFile, host: Host) -> str:
        """After the serving host rebooted (the driver or MIG phase): the server again, on a new connection."""
        self.release()
        self.session = Session(host, ctx.sudo_passwords.get(host.name))
        problem = self._start(self.session, b, host)
        if not problem:
            ctx.emit(f"bundle: served again from {host.name} after its reboot")
        return problem

    def release(self) -> None:
        if self.held is not None:
            self.held.release()
            self.held = None
        if self.session is not None:
            self.session.close()
            self.session = None
