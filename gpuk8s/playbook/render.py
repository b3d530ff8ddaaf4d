"""Render playbooks for one host: jinja2 over each step, with every value that reaches a shell quoted.

In `check` and `run`, every `{{ expression }}` is passed through shlex.quote (the environment's
finalize), so an inventory value can never become shell syntax. File contents are not shell and are
rendered without quoting; `when` is a jinja2 expression evaluated here, never on the host.

A step made from a shared step (model.py, `use:`) is rendered with `params` in its context; a template's
`{% include 'NAME' %}` takes a block of playbooks/_shared.yaml, compiled in the including template's
environment (so check and run quote its values too).
"""

from __future__ import annotations

import base64
import functools
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jinja2

from gpuk8s import fabricplan, mirrors, runtimeplan, versions
from gpuk8s.driver import rules as driver_rules
from gpuk8s.facts.model import UBUNTU_CODENAMES, HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.playbook.model import ParamValue, Playbook, PlaybookError, Step, load_shared
from gpuk8s.versions import at_least, release

_DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _quote(value: Any) -> str:
    return shlex.quote(str(value))


def _block(name: str) -> tuple[str, None, Callable[[], bool]] | None:
    """A shared block for {% include %}: jinja2 compiles it once per environment and keeps it while the shared
    file still has that text (a test that swaps the shared file gets its own block, not a stale one)."""
    text = load_shared().blocks.get(name)
    if text is None:
        return None
    return text, None, lambda: load_shared().blocks.get(name) == text


SHELL_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, finalize=_quote, autoescape=False,
                            keep_trailing_newline=True, loader=jinja2.FunctionLoader(_block))
_text = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
                           loader=jinja2.FunctionLoader(_block))


@dataclass(frozen=True)
class RenderedStep:
    playbook: str
    name: str
    title: str
    check: str
    run: str
    changes: tuple[str, ...]
    restarts: str = ""
    file_path: str = ""  # for file steps: what is written (the content travels base64-encoded)
    file_content: str = ""


def context(inv: Inventory, host: Host, facts: HostFacts) -> dict[str, Any]:
    """What a playbook may refer to. Keep it small: every name here is part of the playbook format."""
    c = inv.cluster
    minor = ".".join(c.kubernetes_version.split(".")[:2])
    patch = c.kubernetes_version if c.kubernetes_version.count(".") == 2 else ""
    cd = containerd_plan(inv, facts, is_gpu_node(host) and host.gpu.allocator.kind == "dra")
    return {
        "host": {"name": host.name, "address": host.address, "role": host.role},
        "os": {"family": facts.os.family, "id": facts.os.id, "version_id": facts.os.version_id},
        "arch": facts.arch,
        "deb_arch": _DEB_ARCH.get(facts.arch, facts.arch),
        "gpu": is_gpu_node(host),  # the GPU plan decides (gpuk8s/gpuplan.py), nothing else
        # the NVIDIA driver where gpuk8s manages it (gpuk8s/driver/rules.py decides branch, modules, packages)
        "driver": (driver_rules.playbook_context(host.gpu.driver, facts, repo=inv.install.driver_repo)
                   if is_gpu_node(host) else {"manage": False}),
        # the RDMA fabric where the inventory sets fabric: (gpuk8s/fabricplan.py decides GPUDirect's path)
        "fabric": {"enabled": is_gpu_node(host) and host.gpu.fabric.enabled,
                   "peermem": is_gpu_node(host) and host.gpu.fabric.enabled
                   and fabricplan.gpudirect(host, facts)[0] == "peermem"},
        "runtime": c.container_runtime,
        # containerd 2.x reads config version 3, where the CRI runtime plugin has another name (the containerd
        # the host will have: after the upgrade, where install upgrades it)
        "cri_plugin": cd["cri_plugin"],
        "containerd": cd,
        # the inventory's registry: block (containerd.yaml's registry-* steps; gpuk8s/mirrors.py decides)
        "registry": mirrors.playbook_context(inv),
        # cri-dockerd (Docker hosts): the release archive for this host's architecture and the sha256 it must
        # have (version matrix; install.cri_dockerd_url and install.cri_dockerd_sha256 override them)
        "cri_dockerd": {
            "version": versions.cri_dockerd().version,
            "archive": f"{inv.install.cri_dockerd_url}/"
                       f"{versions.cri_dockerd().archive(_DEB_ARCH.get(facts.arch, facts.arch))}",
            "sha256": inv.install.cri_dockerd_sha256.get(_DEB_ARCH.get(facts.arch, facts.arch), ""),
        },
        # nvidia-ctk >= 1.18 writes nvidia's runtime into a drop-in and an imports line (--drop-in-config)
        "toolkit_dropin": at_least(release(inv.install.toolkit_version) or (0,), TOOLKIT_DROPIN),
        "kubernetes": {"minor": minor, "version": c.kubernetes_version, "patch": patch,
                       # what an installed package's version starts with: 1.30.2-1.1 (deb), 1.30.2 (rpm)
                       "deb_prefix": f"{patch}-" if patch else f"{minor}.",
                       "rpm_prefix": patch or f"{minor}."},
        "install": {
            "toolkit_version": inv.install.toolkit_version,
            "toolkit_repo": inv.install.toolkit_repo,
            "kubernetes_repo": inv.install.kubernetes_repo,
            "lock_timeout": inv.install.package_lock_timeout,
            # a repository's signing key: fetched over http only where insecure_http is set, and checked
            # against the pinned fingerprint (40 upper-case hex digits; "" when none is pinned)
            "toolkit_repo_insecure_http": inv.install.toolkit_repo_insecure_http,
            "toolkit_repo_key_fingerprint": inv.install.toolkit_repo_key_fingerprint or "",
            "kubernetes_repo_insecure_http": inv.install.kubernetes_repo_insecure_http,
            "kubernetes_repo_key_fingerprint": inv.install.kubernetes_repo_key_fingerprint or "",
            "containerd_version": inv.install.containerd_version,
            "containerd_repo": inv.install.containerd_repo,
            "containerd_repo_insecure_http": inv.install.containerd_repo_insecure_http,
            "containerd_repo_key_fingerprint": inv.install.containerd_repo_key_fingerprint or "",
            "driver_repo_insecure_http": inv.install.driver_repo_insecure_http,
            "driver_apt_repo": inv.install.driver_apt_repo,
            "driver_repo_key_fingerprint": inv.install.driver_repo_key_fingerprint or "",
        },
    }


TOOLKIT_DROPIN = (1, 18)  # the first nvidia-container-toolkit release that writes a drop-in (conf.d/99-nvidia.toml)


def containerd_plan(inv: Inventory, facts: HostFacts, dra: bool = False) -> dict[str, Any]:
    """What the containerd playbook does about containerd itself on this host (runtimeplan decides it).

    `upgrade`: install replaces the host's containerd, below its floor, by containerd.io at
    install.containerd_version. `major`: the containerd major the host has once the playbook ran; `config_version`
    and `cri_plugin` follow from it (3 and io.containerd.cri.v1.runtime for containerd 2.x)."""
    plan = runtimeplan.containerd_plan(inv.cluster, inv.install, facts, dra)
    return {
        "upgrade": plan.upgrade,
        "major": plan.major,
        "config_version": 3 if plan.major >= 2 else 2,
        "cri_plugin": "io.containerd.cri.v1.runtime" if plan.major >= 2 else "io.containerd.grpc.v1.cri",
        # Docker's repositories: linux/ubuntu CODENAME, linux/rhel/8 (the RHEL 8 family: Alibaba Cloud Linux 3)
        "deb_codename": UBUNTU_CODENAMES.get(facts.os.version_id, "jammy"),
        "rpm_version": inv.install.containerd_version.split("-")[0],
    }


# Compiled once per run, not once per host: jinja2's from_string compiles every time (60 ms of client CPU per
# host for the playbooks' ~100 templates); the templates are the playbooks' own text, a small fixed set.
@functools.lru_cache(maxsize=2048)
def _template(shell: bool, template: str) -> jinja2.Template:
    return (SHELL_ENV if shell else _text).from_string(template)


@functools.lru_cache(maxsize=512)
def _expression(expr: str) -> Any:
    return SHELL_ENV.compile_expression(expr, undefined_to_none=False)


def _render(env: jinja2.Environment, template: str, ctx: dict[str, Any], where: str) -> str:
    try:
        return _template(env is SHELL_ENV, template).render(ctx)
    except jinja2.TemplateError as e:
        raise PlaybookError(f"{where}: {type(e).__name__}: {e}") from None


def applies(step: Step, ctx: dict[str, Any], where: str) -> bool:
    if not step.when.strip():
        return True
    try:
        return bool(_expression(step.when)(**ctx))
    except jinja2.TemplateError as e:
        raise PlaybookError(f"{where}: when: {type(e).__name__}: {e}") from None


def _with_params(step: Step, ctx: dict[str, Any], where: str) -> dict[str, Any]:
    """The context of a step made from a shared step: the host's, and `params`, each string param rendered for
    this host like a title (not quoted: check and run quote `{{ params.NAME }}` where they use it)."""
    params: dict[str, ParamValue] = {
        k: _render(_text, v, ctx, f"{where}: params.{k}") if isinstance(v, str) else v for k, v in step.params}
    return {**ctx, "params": params}


def render_playbook(pb: Playbook, ctx: dict[str, Any]) -> list[RenderedStep]:
    """The steps of `pb` that apply to this host, ready to put into the remote script."""
    out = []
    for step in pb.steps:
        where = f"playbooks/{pb.name}.yaml: {step.name}" + (f" (use: {step.use})" if step.use else "")
        if not applies(step, ctx, where):
            continue
        sctx = _with_params(step, ctx, where) if step.use else ctx  # the step's own context
        if step.file is not None:
            path = _render(_text, step.file.path, sctx, where)
            if not path.startswith("/") or any(ch in path for ch in "\n'\"$`\\ "):
                raise PlaybookError(f"{where}: file path {path!r} must be absolute and plain")
            content = _render(_text, step.file.content, sctx, where)
            b64 = base64.b64encode(content.encode()).decode()
            qpath, mode = shlex.quote(path), shlex.quote(step.file.mode)
            out.append(RenderedStep(
                pb.name, step.name, _render(_text, step.title, sctx, where),
                check=f"printf '%s' {b64} | base64 -d | cmp -s - {qpath} && gk_mode_is {qpath} {mode}",
                run=f"gk_put {qpath} {mode} {b64}",
                changes=(path,), restarts=step.restarts, file_path=path, file_content=content,
            ))
            continue
        out.append(RenderedStep(
            pb.name, step.name, _render(_text, step.title, sctx, where),
            check=_render(SHELL_ENV, step.check, sctx, where).strip(),
            run=_render(SHELL_ENV, step.run, sctx, where).strip(),
            changes=tuple(_render(_text, c, sctx, where) for c in step.changes),
            restarts=step.restarts,
        ))
    return out
