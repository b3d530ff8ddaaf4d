"""The inventory's `mig:` key: per host, in gpu_groups and gpu_defaults; every mistake with file:line and a fix."""

from __future__ import annotations

import pytest

from gpuk8s.inventory import loader
from gpuk8s.mig import layout as L

HEAD = """cluster: {name: lab}
ssh: {user: gpuk8s}
"""


def inv(hosts: str, extra: str = "") -> str:
    return HEAD + extra + "hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n" + hosts


def problems(text: str) -> list[loader.Problem]:
    with pytest.raises(loader.InventoryError) as e:
        loader.loads(text, "inv.yaml")
    return [p for p in e.value.problems if p.severity == "error"]


def test_named_layout_on_a_host():
    i = loader.loads(inv("  - name: gpu-1\n    address: 10.0.0.2\n    gpus: 8\n"
                         "    mig: {strategy: single, config: all-1g.10gb}\n"), "inv.yaml")
    m = i.host("gpu-1").gpu.mig
    assert (m.strategy, m.config, m.enabled) == ("single", "all-1g.10gb", True)
    assert m.layout == L.named("all-1g.10gb") and m.line == 8


def test_explicit_list_and_groups_and_defaults():
    text = inv("  - {name: gpu-1, address: 10.0.0.2, gpus: 8, gpu_group: h200}\n"
               "  - {name: gpu-2, address: 10.0.0.3, gpus: 8}\n"
               "  - {name: gpu-3, address: 10.0.0.4, gpus: 8, mig: {strategy: none}}\n",
               "gpu_defaults:\n  mig: {strategy: mixed, config: all-balanced}\n"
               "gpu_groups:\n  h200:\n    mig:\n      strategy: mixed\n      config:\n"
               "        - devices: all\n          mig-devices: {\"3g.71gb\": 2}\n"
               "        - devices: [7]\n          mig-enabled: false\n")
    i = loader.loads(text, "inv.yaml")
    g1 = i.host("gpu-1").gpu.mig
    assert g1.config == "custom" and g1.layout is not None
    assert g1.layout.entries == (L.Entry("all", True, (("3g.71gb", 2),)), L.Entry((7,), False, ()))
    assert i.host("gpu-2").gpu.mig.config == "all-balanced"
    assert not i.host("gpu-3").gpu.mig.enabled and i.host("gpu-3").gpu.mig.strategy == "none"


@pytest.mark.parametrize(("mig", "line", "message", "fix"), [
    ("{strategy: single, config: all-1g.11gb}", 8, "unknown MIG layout 'all-1g.11gb'", "all-balanced"),
    ("{strategy: split, config: all-1g.10gb}", 8, "'split' is not one of none, single, mixed", "single"),
    ("{config: all-1g.10gb}", 8, "no strategy given", "none, single, mixed"),
    ("{strategy: single}", 8, "strategy single needs a layout", "all-1g.10gb"),
    ("{strategy: none, config: all-1g.10gb}", 8, "has no effect with strategy: none", "remove config"),
    ("{strategy: single, config: all-balanced}", 8, "single strategy needs every GPU", "strategy: mixed"),
    ("{strategy: mixed, config: [{devices: all, mig-devices: {'3g40gb': 2}}]}", 8, "is not a MIG profile name",
     "3g.40gb"),
    ("{strategy: mixed, config: [{devices: all, mig-devices: {'3g.41gb': 2}}]}", 8, "no GPU gpuk8s knows",
     "did you mean"),
    ("{strategy: mixed, config: [{devices: all, mig-devices: {'3g.40gb': 9}}]}", 8, "out of range", "1 to 7"),
    ("{strategy: mixed, config: [{devices: some}]}", 8, "is not a GPU list", "devices: all"),
    ("{strategy: mixed, config: [{devices: all}]}", 8, "no MIG devices for these GPUs", "mig-enabled: false"),
    ("{strategy: mixed, config: [{devices: all, mig-device: {'1g.10gb': 7}}]}", 8, "unknown key 'mig-device'",
     "mig-devices"),
    ("{strategy: single, config: [{devices: all, mig-devices: {'1g.10gb': 3, '2g.20gb': 1}}]}", 8,
     "single strategy needs every GPU", "mixed"),
])
def test_mistakes_have_a_line_and_a_fix(mig, line, message, fix):
    ps = problems(inv(f"  - name: gpu-1\n    address: 10.0.0.2\n    gpus: 8\n    mig: {mig}\n"))
    assert ps, mig
    p = ps[0]
    assert p.file == "inv.yaml" and p.line == line, str(p)
    assert message in p.message and fix in p.fix, str(p)


def test_mps_with_mig_is_an_inventory_error():
    ps = problems(inv("  - name: gpu-1\n    address: 10.0.0.2\n    gpus: 8\n"
                      "    gpu_sharing: {strategy: mps, replicas: 4}\n"
                      "    mig: {strategy: mixed, config: all-3g.40gb}\n"))
    assert any("MPS sharing cannot be combined with MIG" in p.message and p.line == 9 and "time-slicing" in p.fix
               for p in ps), [str(p) for p in ps]
    # time-slicing with mixed MIG is the device plugin's supported combination
    ok = loader.loads(inv("  - name: gpu-1\n    address: 10.0.0.2\n    gpus: 8\n"
                          "    gpu_sharing: {strategy: time-slicing, replicas: 4}\n"
                          "    mig: {strategy: mixed, config: all-3g.40gb}\n"), "inv.yaml")
    assert ok.host("gpu-1").gpu.mig.enabled


@pytest.mark.parametrize("value", ["all-1g.10gb;touch /tmp/x", "$(reboot)", "all-1g.10gb\nreboot"])
def test_hostile_layout_names_and_profiles_never_load(value):
    ps = problems(inv(f"  - name: gpu-1\n    address: 10.0.0.2\n    gpus: 8\n    mig: {{strategy: single, "
                      f"config: {value!r}}}\n".replace("\\n", " ")))
    assert ps and ps[0].fix
    ps = problems(inv("  - name: gpu-1\n    address: 10.0.0.2\n    gpus: 8\n    mig: {strategy: mixed, config: "
                      f"[{{devices: all, mig-devices: {{{value.replace(chr(10), ' ')!r}: 1}}}}]}}\n"))
    assert ps and ps[0].fix
