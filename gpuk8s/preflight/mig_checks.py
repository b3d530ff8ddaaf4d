"""Preflight checks of the hosts whose inventory asks for MIG (docs/mig.md): capability, profiles, driver
floor, pending mode and the processes that would block a change. Pure: host and facts in, findings out."""

from __future__ import annotations

from gpuk8s.facts.model import GPU, HostFacts, MigGPU
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Host
from gpuk8s.mig import layout as L
from gpuk8s.mig.profiles import DRIVER_FLOORS, family, model_for
from gpuk8s.preflight.result import CheckResult, failed, passed, skipped
from gpuk8s.versions import at_least

IDS = ("gpu.mig-capable", "gpu.mig-profile", "gpu.mig-driver", "gpu.mig-pending", "gpu.mig-processes")


def mig_checks(host: Host, f: HostFacts) -> list[CheckResult]:
    """Nothing for a host without `mig:` (or with strategy none)."""
    s = host.gpu.mig
    if not is_gpu_node(host) or not s.enabled or s.layout is None:
        return []
    if f.gpu.state != "ok":
        return [skipped(i, "no working driver (see gpu.driver)") for i in IDS]
    if f.mig.state != "ok":
        why = f"cannot read the MIG state: {f.mig.error or f.mig.state}"
        return [failed("gpu.mig-capable", why, "check nvidia-smi on the host; MIG needs driver R450 or newer")] + [
            skipped(i, "no MIG state") for i in IDS[1:]]
    out: list[CheckResult] = []
    mig = {g.index: g for g in f.mig.gpus}
    wants: dict[int, tuple[str, ...] | None] = {}
    no_mig: list[GPU] = []
    bad_profile: list[tuple[int, L.LayoutError]] = []
    for g in f.gpu.gpus:
        model = model_for(g.name, g.memory_mib)
        m = mig.get(g.index)
        capable = family(g.name) is not None and (m is None or m.capable)
        try:
            want = L.wanted(s.layout, g.index, model, f"{g.name} ({(g.memory_mib or 0) // 1024} GiB)")
            _offered(want, m, g)
        except L.LayoutError as e:
            if not capable:
                no_mig.append(g)
            else:
                bad_profile.append((g.index, e))
            continue
        wants[g.index] = want
    if no_mig:
        names = sorted({g.name for g in no_mig})
        out.append(failed("gpu.mig-capable", f"MIG requested on a GPU without MIG ({', '.join(names)}): GPU "
                          f"{', '.join(str(g.index) for g in no_mig)}",
                          "remove mig from this host (or its gpu_group); MIG exists on A100, A30, H100, H200, "
                          "B200; share other GPUs with gpu_sharing: time-slicing"))
    else:
        out.append(passed("gpu.mig-capable", f"every GPU named by the layout has MIG ({_models(f)})"))
    if bad_profile:
        i, err = bad_profile[0]
        more = f" (and {len(bad_profile) - 1} more GPU(s))" if len(bad_profile) > 1 else ""
        out.append(failed("gpu.mig-profile", f"GPU {i}: {err.message}{more}", err.fix))
    elif no_mig:
        out.append(skipped("gpu.mig-profile", "GPUs without MIG"))
    else:
        out.append(passed("gpu.mig-profile", f"layout {s.config} fits every GPU: " + "; ".join(
            f"GPU {i}: {', '.join(L.counted(w)) if w else 'MIG off'}" for i, w in sorted(wants.items()))))
    out.append(_driver(f))
    pending = [m for m in f.mig.gpus if m.capable and m.current != m.pending]
    if pending:
        out.append(failed("gpu.mig-pending", "MIG mode is pending on GPU " + ", ".join(
            f"{m.index} ({m.current.lower()} now, {m.pending.lower()} after a reset)" for m in pending)
            + ": the GPU needs a reset or a reboot",
            "stop what uses the GPU and run nvidia-smi -i N -r, or reboot the host (sudo systemctl reboot); "
            "gpuk8s install tries the reset itself"))
    else:
        out.append(passed("gpu.mig-pending", "no MIG mode change is pending"))
    busy = []
    for g in f.gpu.gpus:
        m = mig.get(g.index)
        if m is None or not m.processes or g.index not in wants:
            continue
        if L.diff(L.state_of(m), wants[g.index], model_for(g.name, g.memory_mib)).status != "unchanged":
            busy.append(m)
    if busy:
        out.append(failed("gpu.mig-processes", "; ".join(
            f"{len(m.processes)} process{'es' if len(m.processes) > 1 else ''} use GPU {m.index} "
            f"({', '.join(sorted({p.name.rsplit('/', 1)[-1] for p in m.processes})[:3])})" for m in busy)
            + ": stop them before MIG can be changed",
            "stop the GPU workloads and monitoring agents (nvidia-smi --query-compute-apps=pid,process_name "
            "--format=csv lists them; dcgm and nvsm services too), or let gpuk8s report the host as needing "
            "a reboot"))
    else:
        out.append(passed("gpu.mig-processes", "no process holds a GPU whose MIG layout must change"))
    return out


def _offered(want: tuple[str, ...] | None, m: MigGPU | None, g: GPU) -> None:
    """LayoutError where the host's own `nvidia-smi mig -lgip` (read when the GPU is or will be in MIG mode) does
    not list a profile the layout wants: drivers differ from the tables (an A100-80GB on R515 has no 1g.20gb;
    gpu-operator issue 351 met 7g.79gb where the table says 7g.80gb)."""
    if not want or m is None or not m.profiles:
        return
    offered = {p.name for p in m.profiles}
    missing = sorted(set(want) - offered)
    if missing:
        raise L.LayoutError("unknown-profile",
                            f"the driver on this {g.name} does not offer {', '.join(missing)} "
                            f"(nvidia-smi mig -lgip lists {', '.join(p.name for p in m.profiles)})",
                            "choose the layout from the profiles nvidia-smi mig -lgip lists on this host, or "
                            "install the driver branch that offers it")


def _models(f: HostFacts) -> str:
    return ", ".join(sorted({g.name for g in f.gpu.gpus}))


def _driver(f: HostFacts) -> CheckResult:
    rel = f.gpu.driver_release
    floors = sorted({DRIVER_FLOORS[fam] for g in f.gpu.gpus if (fam := family(g.name)) in DRIVER_FLOORS})
    if not floors:
        return skipped("gpu.mig-driver", "no driver floor known for these GPUs")
    floor, text = floors[-1]
    if rel is None:
        return failed("gpu.mig-driver", f"cannot read the driver version from {f.gpu.driver!r}",
                      "check nvidia-smi on the host")
    if at_least(rel, floor):
        return passed("gpu.mig-driver", f"driver {f.gpu.driver} >= {text}, MIG's floor for {_models(f)}")
    return failed("gpu.mig-driver", f"driver {f.gpu.driver} is below {text}, the first with MIG on {_models(f)}",
                  f"upgrade the NVIDIA datacenter driver to {text} or newer (the current R535/R550/R570 branches "
                  "are), then reboot")
