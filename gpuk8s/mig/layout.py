"""MIG layouts: named (as nvidia-mig-parted names them) or explicit, resolved per GPU, diffed, counted.

A layout is a list of entries `{devices: all | [0, 1], mig-enabled: true, mig-devices: {"3g.40gb": 2}}`
(nvidia-mig-parted's `version: v1` format, https://github.com/NVIDIA/mig-parted). The named layouts are
those of mig-parted's default configuration: `all-disabled`, `all-enabled`, `all-<profile>` (every GPU cut
into as many <profile> as it holds: all-1g.10gb is 7 x 1g.10gb on an A100-80GB; `all-1g.10gb.me` is the
one media-extension slice) and `all-balanced` (2 x the smallest 1g, 1 x 2g and 1 x 3g on a 7-slice GPU;
2 x 1g and 1 x 2g on a 4-slice A30: mig-parted's pkg/mig/builder tests list them per board).

Pure functions only: `named`, `wanted` (one GPU's profile list, or None for MIG off), `creation_order`
(whether and how the profiles fit), `diff` (what to run on one GPU; nothing when it is right already) and
`mig_resources` (what the device plugin will advertise with the single or mixed strategy).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import permutations
from typing import Literal

from gpuk8s.errors import GpuK8sError
from gpuk8s.facts.model import MigGPU
from gpuk8s.mig.profiles import MODELS, Model, no_table_fix

Strategy = Literal["none", "single", "mixed"]
STRATEGIES: tuple[str, ...] = ("none", "single", "mixed")
# the variants real -lgip tables list: +me (A100/A30/H100/H200/B200), +me.all, +gfx and -me (RTX PRO 6000
# Blackwell, tests/fixtures/real/mig/rtxpro6000-lgip.txt); nvidia-mig-parted names a layout of a variant with
# '.' for '+' (all-1g.10gb.me, all-1g.24gb.gfx, all-1g.24gb.me.all)
PROFILE_RE = re.compile(r"^[1-8]g\.[0-9]{1,3}gb(\+me\.all|\+me|\+gfx|-me)?$")
NAME_RE = re.compile(r"^all-(disabled|enabled|balanced|[1-8]g\.[0-9]{1,3}gb(\.me\.all|\.me|\.gfx|-me)?)$")
MAX = -1  # "as many as the GPU holds" (the all-<profile> layouts)


class LayoutError(GpuK8sError, ValueError):
    """A layout that cannot be used: kind is unknown-name, bad-profile, unknown-profile, does-not-fit or
    single-needs-one-profile; fix says what to write instead (the remedy)."""

    def __init__(self, kind: str, message: str, fix: str = "") -> None:
        super().__init__(message, fix, kind)
        self.fix = self.remedy


@dataclass(frozen=True)
class Entry:
    devices: Literal["all"] | tuple[int, ...] = "all"
    enabled: bool = True
    mig_devices: tuple[tuple[str, int], ...] = ()  # (profile, count); count MAX: as many as fit


@dataclass(frozen=True)
class Layout:
    name: str  # the named layout, or "custom" for an explicit list
    entries: tuple[Entry, ...] = field(default=())

    @property
    def balanced(self) -> bool:
        return self.name == "all-balanced"


def known_profiles() -> set[str]:
    return {p.name for m in MODELS.values() for p in m.profiles}


def check_profile(name: str) -> None:
    """Raises LayoutError(bad-profile) unless `name` is written as a MIG profile (3g.40gb, 1g.10gb+me)."""
    if not PROFILE_RE.match(name):
        raise LayoutError("bad-profile", f"{name!r} is not a MIG profile name",
                          "write it as nvidia-smi mig -lgip prints it, e.g. 1g.10gb, 3g.40gb or 1g.18gb+me")


def named(name: str) -> Layout:
    """The named layout `name`; LayoutError(unknown-name) for any other name."""
    m = NAME_RE.match(name)
    profile = m.group(1).replace(".me", "+me").replace(".gfx", "+gfx") if m else ""
    if not m or (profile not in ("disabled", "enabled", "balanced") and profile not in known_profiles()):
        sample = ", ".join(sorted(f"all-{p.name}" for p in MODELS["A100-80GB"].profiles if not p.media))
        raise LayoutError("unknown-name", f"unknown MIG layout {name!r}",
                          f"use all-disabled, all-enabled, all-balanced or all-<profile> (on an A100-80GB: "
                          f"{sample}), or an explicit list [{{devices: all, mig-devices: {{\"3g.40gb\": 2}}}}]")
    if profile == "disabled":
        return Layout(name, (Entry("all", False),))
    if profile in ("enabled", "balanced"):
        return Layout(name, (Entry("all", True),))
    return Layout(name, (Entry("all", True, ((profile, MAX),)),))


def explicit(entries: list[Entry]) -> Layout:
    for e in entries:
        for p, n in e.mig_devices:
            check_profile(p)
            if n < 1:
                raise LayoutError("bad-profile", f"{p}: {n} instances", "write a count of 1 or more")
    return Layout("custom", tuple(entries))


def _entry_for(layout: Layout, index: int) -> Entry | None:
    """The entry that applies to GPU `index`: the last one naming it (as mig-parted applies them in order)."""
    hit = None
    for e in layout.entries:
        if e.devices == "all" or index in e.devices:
            hit = e
    return hit


def _balanced(model: Model) -> tuple[str, ...]:
    by_g = {g: next((p.name for p in model.profiles if p.slices == g and not p.media), None) for g in (1, 2, 3)}
    smallest = model.smallest.name
    if model.compute_slices >= 7:
        return (smallest, smallest, str(by_g[2]), str(by_g[3]))
    return (smallest, smallest, str(by_g[2]))


def wanted(layout: Layout, index: int, model: Model | None, gpu_label: str = "") -> tuple[str, ...] | None:
    """The profiles GPU `index` must hold (sorted), or None for MIG disabled (also: no entry names it).

    Raises LayoutError unknown-profile (a profile this model lacks, naming its smallest) or does-not-fit."""
    e = _entry_for(layout, index)
    if e is None or not e.enabled:
        return None
    label = gpu_label or (model.key if model else "this GPU")
    if model is None:
        raise LayoutError("unknown-profile", f"gpuk8s has no MIG profile table for {label}", no_table_fix(label))
    if layout.balanced:
        names: list[str] = list(_balanced(model))
    else:
        names = []
        for p, n in e.mig_devices:
            prof = model.profile(p)
            if prof is None:
                raise LayoutError("unknown-profile",
                                  f"profile {p} does not exist on {label} (its smallest is {model.smallest.name})",
                                  f"use the profiles of {model.key}: "
                                  + ", ".join(x.name for x in model.profiles))
            names += [p] * (prof.instances if n == MAX else n)
    if creation_order(model, names) is None:
        raise LayoutError("does-not-fit", f"{' + '.join(_counted(names))} do not fit on one GPU ({label})",
                          f"a {model.key} has {model.compute_slices} compute slices and "
                          f"{model.memory_slices} memory slices; see nvidia-smi mig -lgip")
    return tuple(sorted(names))


def _counted(names: list[str] | tuple[str, ...]) -> list[str]:
    return [f"{n} x {p}" for p, n in sorted(Counter(names).items())]


counted = _counted  # "7 x 1g.10gb", for messages


def _first_fit(model: Model, order: tuple[str, ...]) -> bool:
    used = [False] * model.memory_slices
    compute = 0
    for name in order:
        p = model.profile(name)
        if p is None:
            return False
        start = next((s for s in p.placements if s + p.size <= len(used) and not any(used[s:s + p.size])), None)
        if start is None:
            return False
        used[start:start + p.size] = [True] * p.size
        compute += p.slices
    return compute <= model.compute_slices


def creation_order(model: Model, names: list[str] | tuple[str, ...]) -> tuple[str, ...] | None:
    """An order in which `nvidia-smi mig -cgi A,B,C -C` creates them all when each GPU instance takes the
    lowest free placement of its profile (nvidia-smi mig -lgipp), or None when they cannot fit."""
    counts = Counter(names)
    profs = {p: model.profile(p) for p in counts}
    sizes: dict[str, int] = {}
    slices = 0
    for p, n in counts.items():
        prof = profs[p]
        if prof is None or n > prof.instances:
            return None
        sizes[p] = prof.size
        slices += prof.slices * n
    if slices > model.compute_slices:
        return None
    # largest first is right almost always; then every distinct order of the (at most 8) instances
    first = tuple(sorted(names, key=lambda p: (-sizes[p], p)))
    if _first_fit(model, first):
        return first
    seen: set[tuple[str, ...]] = set()
    for order in permutations(names):
        if order in seen:
            continue
        seen.add(order)
        if _first_fit(model, order):
            return order
    return None


# -- the diff ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPUState:
    """One GPU as the facts saw it."""

    index: int
    mode_current: str = "Disabled"  # Enabled | Disabled | [N/A]
    mode_pending: str = "Disabled"
    instances: tuple[str, ...] = ()  # the profiles of GPU instances that have a compute instance
    bare_instances: int = 0  # GPU instances without a compute instance (no MIG device)
    orphan_cis: int = 0


def state_of(g: MigGPU) -> GPUState:
    """A GPU's state from the probe's facts (gpuk8s/facts/mig.py)."""
    gis = {i.id for i in g.instances}
    with_ci = {c.gi for c in g.computes}
    return GPUState(g.index, g.current, g.pending, tuple(sorted(i.profile for i in g.instances if i.id in with_ci)),
                    sum(1 for i in g.instances if i.id not in with_ci), sum(1 for c in g.computes if c.gi not in gis))


@dataclass(frozen=True)
class GPUChange:
    index: int
    status: Literal["unchanged", "change"]
    reason: str
    mode: int | None = None  # nvidia-smi -i N -mig 1|0
    destroy: bool = False  # -dci then -dgi
    create: tuple[str, ...] = ()  # -cgi LIST -C, in this order
    want_enabled: bool = False

    def commands(self) -> list[str]:
        """The commands in the order mig-apply.sh runs them (the reset only where the mode is pending)."""
        i = self.index
        out: list[str] = []
        if self.destroy:
            out += [f"nvidia-smi mig -i {i} -dci", f"nvidia-smi mig -i {i} -dgi"]
        if self.mode is not None:
            out.append(f"nvidia-smi -i {i} -mig {self.mode}")
            out.append(f"nvidia-smi -i {i} -r   # only while mig.mode.pending differs from mig.mode.current")
        if self.create:
            out.append(f"nvidia-smi mig -i {i} -cgi {','.join(self.create)} -C")
        return out


def diff(state: GPUState, want: tuple[str, ...] | None, model: Model | None) -> GPUChange:
    """What GPU `state.index` needs to hold `want` (None: MIG off); unchanged when it already does."""
    enabled = state.mode_current == "Enabled"
    pending = state.mode_pending == "Enabled"
    has = sorted(state.instances)
    if want is None:
        if not enabled and not pending and not has and not state.bare_instances:
            return GPUChange(state.index, "unchanged", "MIG is off")
        return GPUChange(state.index, "change", "MIG must be off",
                         mode=0 if (enabled or pending) else None,
                         destroy=bool(has or state.bare_instances or state.orphan_cis))
    right = enabled and pending and has == sorted(want) and not state.bare_instances and not state.orphan_cis
    if right:
        return GPUChange(state.index, "unchanged", f"holds {', '.join(_counted(want))}", want_enabled=True)
    order = creation_order(model, want) if model is not None else tuple(want)
    reason = (f"MIG mode {state.mode_current.lower()} (pending {state.mode_pending.lower()})" if not enabled
              else f"holds {', '.join(_counted(has)) or 'no instances'}")
    return GPUChange(state.index, "change", f"{reason}; wants {', '.join(_counted(want))}",
                     mode=1 if not (enabled and pending) else None,
                     destroy=bool(has or state.bare_instances or state.orphan_cis),
                     create=order or tuple(want), want_enabled=True)


# -- what Kubernetes will see --------------------------------------------------------------------------
def resource_name(profile: str) -> str:
    """The device plugin's mixed-strategy resource of a profile: nvidia.com/mig-3g.40gb."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def mig_resources(layout: Layout | None, strategy: str, gpus: list[tuple[int, Model | None]],
                  label: str = "") -> dict[str, int]:
    """The extended resources a node advertises: `gpus` are (index, profile table) of its GPUs.

    none: nvidia.com/gpu = the GPUs. single: nvidia.com/gpu = the MIG devices (every GPU must be MIG with one
    profile, as the plugin's single strategy requires). mixed: nvidia.com/mig-<profile> counts, plus
    nvidia.com/gpu for GPUs left whole."""
    if strategy == "none" or layout is None:
        return {"nvidia.com/gpu": len(gpus)} if gpus else {}
    out: Counter[str] = Counter()
    profiles: set[str] = set()
    whole = 0
    for index, model in gpus:
        want = wanted(layout, index, model, label)
        if want is None:
            whole += 1
            continue
        profiles.update(want)
        for p in want:
            out[resource_name(p)] += 1
    if strategy == "single":
        if whole or len(profiles) > 1:
            raise LayoutError("single-needs-one-profile",
                              "the single strategy needs every GPU of the node in MIG mode with one profile "
                              f"(found {', '.join(sorted(profiles)) or 'no profiles'}"
                              f"{f' and {whole} whole GPU(s)' if whole else ''})",
                              "use strategy: mixed, or one profile on every GPU (e.g. all-1g.10gb)")
        return {"nvidia.com/gpu": sum(out.values())}
    if whole:
        out["nvidia.com/gpu"] += whole
    return dict(out)
