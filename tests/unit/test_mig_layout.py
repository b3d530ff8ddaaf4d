"""MIG layouts (gpuk8s/mig): named layouts, resolving against a GPU's profile table, the diff, the resources."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.facts import mig as migparse
from gpuk8s.mig import layout as L
from gpuk8s.mig.profiles import MODELS, family, mig_capable, model_for

A100, H100, H200, A30 = MODELS["A100-80GB"], MODELS["H100-80GB"], MODELS["H200-141GB"], MODELS["A30-24GB"]
FIX = Path(__file__).resolve().parent.parent / "fixtures" / "mig"


def test_the_tables_agree_with_the_guides_lgip_and_the_labs():
    doc = migparse.parse_lgip((FIX / "a100-80gb-lgip.txt").read_text())
    assert [(r.name, r.id, r.total) for r in doc] == [(p.name, p.id, p.instances) for p in A100.profiles]
    lab = [r for r in migparse.parse_lgip((FIX / "h200-lgip.txt").read_text()) if r.gpu == 0]
    assert [(r.name, r.id, r.total) for r in lab] == [(p.name, p.id, p.instances) for p in H200.profiles]
    assert [p.name for p in H100.profiles] == [p.name for p in A100.profiles]


def test_models_from_nvidia_smi_names():
    assert model_for("NVIDIA A100-SXM4-80GB", 81920) is A100
    assert model_for("NVIDIA A100-PCIE-40GB", 40960) is MODELS["A100-40GB"]
    assert model_for("NVIDIA H100 80GB HBM3", 81559) is H100
    assert model_for("NVIDIA H200", 143771) is H200  # the real H200 capture's name and memory
    assert model_for("NVIDIA L4", 23034) is None and not mig_capable("NVIDIA L4")
    assert not mig_capable("Tesla V100-SXM2-32GB") and family("NVIDIA H20") == "H20"
    assert family("NVIDIA H200 NVL") == "H200" and family("NVIDIA H100 PCIe") == "H100"


@pytest.mark.parametrize(("name", "model", "want"), [
    ("all-1g.10gb", A100, ("1g.10gb",) * 7),
    ("all-1g.20gb", A100, ("1g.20gb",) * 4),
    ("all-2g.20gb", H100, ("2g.20gb",) * 3),
    ("all-3g.40gb", A100, ("3g.40gb",) * 2),
    ("all-7g.80gb", H100, ("7g.80gb",)),
    ("all-1g.10gb.me", A100, ("1g.10gb+me",)),
    ("all-3g.71gb", H200, ("3g.71gb",) * 2),
    ("all-1g.18gb", H200, ("1g.18gb",) * 7),
    ("all-balanced", A100, ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")),
    ("all-balanced", H200, ("1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb")),
    ("all-balanced", A30, ("1g.6gb", "1g.6gb", "2g.12gb")),
    ("all-enabled", A100, ()),
    ("all-disabled", A100, None),
])
def test_named_layouts(name, model, want):
    assert L.wanted(L.named(name), 0, model) == want


def test_unknown_names_and_profiles_say_what_to_write():
    for bad in ("all-1g.11gb", "1g.10gb", "all-9g.80gb", "balanced", ""):
        with pytest.raises(L.LayoutError) as e:
            L.named(bad)
        assert e.value.kind == "unknown-name" and "all-balanced" in e.value.fix
    with pytest.raises(L.LayoutError) as e:
        L.wanted(L.named("all-1g.10gb"), 0, H200, "an H200")
    assert e.value.kind == "unknown-profile"
    assert e.value.message == "profile 1g.10gb does not exist on an H200 (its smallest is 1g.18gb)"
    with pytest.raises(L.LayoutError) as e:
        L.explicit([L.Entry("all", True, (("3g40gb", 1),))])
    assert e.value.kind == "bad-profile"
    with pytest.raises(L.LayoutError) as e:
        L.wanted(L.named("all-1g.10gb"), 0, None, "NVIDIA L4")
    assert "NVIDIA L4" in e.value.message


@pytest.mark.parametrize(("devices", "fits"), [
    ({"3g.40gb": 2}, True), ({"4g.40gb": 1, "3g.40gb": 1}, True), ({"2g.20gb": 3, "1g.10gb": 1}, True),
    ({"1g.20gb": 4}, True), ({"3g.40gb": 3}, False), ({"4g.40gb": 2}, False), ({"7g.80gb": 1, "1g.10gb": 1}, False),
    ({"2g.20gb": 3, "1g.10gb": 2}, False), ({"1g.10gb+me": 2}, False), ({"3g.40gb": 1, "1g.20gb": 2}, True),
])
def test_what_fits_on_an_a100(devices, fits):
    layout = L.explicit([L.Entry("all", True, tuple(devices.items()))])
    if fits:
        got = L.wanted(layout, 0, A100)
        assert got is not None and sorted(got) == sorted(p for p, n in devices.items() for _ in range(n))
    else:
        with pytest.raises(L.LayoutError) as e:
            L.wanted(layout, 0, A100, "an A100")
        assert e.value.kind == "does-not-fit" and e.value.message.endswith("do not fit on one GPU (an A100)")


def test_creation_order_places_every_instance_first_fit():
    # 1g first would take slot 0 and leave no place for the 4g: the order puts the 4g first
    assert L.creation_order(A100, ["1g.10gb", "4g.40gb"])[0] == "4g.40gb"
    order = L.creation_order(A100, ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
    assert order is not None and sorted(order) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert L._first_fit(A100, order)


def test_per_device_entries_last_one_wins():
    layout = L.explicit([L.Entry("all", True, (("1g.10gb", 7),)), L.Entry((1,), True, (("3g.40gb", 2),)),
                         L.Entry((2,), False)])
    assert L.wanted(layout, 0, A100) == ("1g.10gb",) * 7
    assert L.wanted(layout, 1, A100) == ("3g.40gb",) * 2
    assert L.wanted(layout, 2, A100) is None
    only = L.explicit([L.Entry((0,), True, (("7g.80gb", 1),))])
    assert L.wanted(only, 1, A100) is None


def test_the_diff_leaves_a_right_gpu_alone_and_orders_the_commands():
    want = ("1g.10gb",) * 7
    right = L.GPUState(0, "Enabled", "Enabled", want)
    assert L.diff(right, want, A100).status == "unchanged" and L.diff(right, want, A100).commands() == []
    fresh = L.diff(L.GPUState(1), want, A100)
    assert fresh.status == "change" and fresh.mode == 1 and not fresh.destroy
    assert fresh.commands() == ["nvidia-smi -i 1 -mig 1",
                                "nvidia-smi -i 1 -r   # only while mig.mode.pending differs from mig.mode.current",
                                "nvidia-smi mig -i 1 -cgi " + ",".join(want) + " -C"]
    other = L.diff(L.GPUState(0, "Enabled", "Enabled", ("3g.40gb", "3g.40gb")), want, A100)
    assert other.mode is None and other.destroy and other.commands()[:2] == ["nvidia-smi mig -i 0 -dci",
                                                                             "nvidia-smi mig -i 0 -dgi"]
    pending = L.diff(L.GPUState(0, "Disabled", "Enabled"), want, A100)
    assert pending.mode == 1 and pending.status == "change"
    bare = L.diff(L.GPUState(0, "Enabled", "Enabled", want[:6], bare_instances=1), want, A100)
    assert bare.status == "change" and bare.destroy
    # back to none
    off = L.diff(L.GPUState(0, "Enabled", "Enabled", want), None, A100)
    assert off.destroy and off.mode == 0
    assert L.diff(L.GPUState(0), None, A100).status == "unchanged"
    assert L.diff(L.GPUState(0, "[N/A]", "[N/A]"), None, None).status == "unchanged"


def test_resources_per_strategy():
    gpus = [(0, A100), (1, A100)]
    one = L.named("all-1g.10gb")
    assert L.mig_resources(one, "single", gpus) == {"nvidia.com/gpu": 14}
    assert L.mig_resources(one, "mixed", gpus) == {"nvidia.com/mig-1g.10gb": 14}
    assert L.mig_resources(one, "none", gpus) == {"nvidia.com/gpu": 2}
    h = L.explicit([L.Entry("all", True, (("3g.71gb", 2),))])
    assert L.mig_resources(h, "mixed", [(i, H200) for i in range(8)]) == {"nvidia.com/mig-3g.71gb": 16}
    bal = L.mig_resources(L.named("all-balanced"), "mixed", gpus)
    assert bal == {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/mig-2g.20gb": 2, "nvidia.com/mig-3g.40gb": 2}
    with pytest.raises(L.LayoutError) as e:
        L.mig_resources(L.named("all-balanced"), "single", gpus)
    assert e.value.kind == "single-needs-one-profile"
    part = L.explicit([L.Entry((0,), True, (("3g.40gb", 2),))])
    assert L.mig_resources(part, "mixed", gpus) == {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/gpu": 1}
    with pytest.raises(L.LayoutError):
        L.mig_resources(part, "single", gpus)
    assert L.mig_resources(L.named("all-1g.10gb.me"), "mixed", [(0, A100)]) == {"nvidia.com/mig-1g.10gb.me": 1}

_ALL = sorted({p.name for m in MODELS.values() for p in m.profiles})


@settings(max_examples=300)
@given(st.sampled_from(sorted(MODELS)), st.dictionaries(st.sampled_from(_ALL), st.integers(1, 8), max_size=4))
def test_any_request_resolves_to_a_placeable_list_or_a_layout_error(key, devices):
    model = MODELS[key]
    try:
        got = L.wanted(L.explicit([L.Entry("all", True, tuple(devices.items()))]), 0, model)
    except L.LayoutError as e:
        assert e.kind in ("unknown-profile", "does-not-fit") and e.fix
        if e.kind == "unknown-profile":
            assert any(model.profile(p) is None for p in devices)
        return
    assert got is not None and sorted(got) == sorted(p for p, n in devices.items() for _ in range(n))
    order = L.creation_order(model, got)
    assert order is not None and L._first_fit(model, order)
    # the diff of a fresh GPU creates exactly these, and a GPU holding them is unchanged
    assert sorted(L.diff(L.GPUState(0), got, model).create) == sorted(got)
    assert L.diff(L.GPUState(0, "Enabled", "Enabled", got), got, model).status == "unchanged"


# ---- the boards the real corpus covers (tests/fixtures/real/mig; test_real_corpus_smi.py checks the tables)
RTX = MODELS["RTX-PRO-6000-96GB"]


def test_models_of_the_real_corpus_boards():
    assert model_for("NVIDIA H100 PCIe", 81559) is MODELS["H100-PCIE-80GB"]  # Scaleway's, 525.125.06
    assert model_for("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887) is RTX  # 610.43.02
    # A800 and H800 are grouped with the A100 and H100 by nvidia-mig-parted's config-default.yaml
    assert model_for("NVIDIA A800 80GB PCIe", 81920) is A100 and family("NVIDIA A800 80GB PCIe") == "A800"
    assert model_for("NVIDIA H800", 81559) is H100 and mig_capable("NVIDIA H800")
    assert [p.placements for p in MODELS["H100-PCIE-80GB"].profiles] == [p.placements for p in H100.profiles]


@pytest.mark.parametrize(("name", "mib"), [
    ("NVIDIA GH200 480GB", 97871), ("NVIDIA B200", 183359), ("NVIDIA GB200", 189471), ("NVIDIA H20", 97871),
    ("NVIDIA H100 NVL", 95830), ("NVIDIA RTX PRO 5000 Blackwell", 48935),
])
def test_a_mig_board_without_a_table_is_named_with_what_to_do_not_planned(name, mib):
    assert mig_capable(name) and model_for(name, mib) is None
    with pytest.raises(L.LayoutError) as e:
        L.wanted(L.named("all-balanced"), 0, model_for(name, mib), name)
    assert e.value.kind == "unknown-profile" and e.value.message == f"gpuk8s has no MIG profile table for {name}"
    assert name in e.value.fix and "remove mig from this host" in e.value.fix and "RTX PRO 6000" in e.value.fix


@pytest.mark.parametrize(("name", "want"), [
    ("all-1g.24gb", ("1g.24gb",) * 4),
    ("all-2g.48gb", ("2g.48gb",) * 2),
    ("all-4g.96gb", ("4g.96gb",)),
    ("all-1g.24gb.gfx", ("1g.24gb+gfx",) * 4),  # nvidia-mig-parted's name for it
    ("all-1g.24gb.me.all", ("1g.24gb+me.all",)),
    ("all-1g.24gb-me", ("1g.24gb-me",) * 4),
    ("all-balanced", ("1g.24gb", "1g.24gb", "2g.48gb")),  # mig-parted's all-balanced for the RTX PRO 6000
])
def test_named_layouts_on_the_rtx_pro_6000(name, want):
    assert L.wanted(L.named(name), 0, RTX) == want


def test_what_fits_on_the_rtx_pro_6000_twelve_unit_grid():
    fits = L.explicit([L.Entry("all", True, (("2g.48gb", 1), ("1g.24gb", 2)))])
    assert L.wanted(fits, 0, RTX) == ("1g.24gb", "1g.24gb", "2g.48gb")
    order = L.creation_order(RTX, ["1g.24gb", "1g.24gb", "2g.48gb"])
    assert order is not None and order[0] == "2g.48gb" and L._first_fit(RTX, order)  # 0:6, then 6:3 and 9:3
    for devices in ((("2g.48gb", 2), ("1g.24gb", 1)), (("4g.96gb", 1), ("1g.24gb-me", 1)), (("1g.24gb+me", 2),)):
        with pytest.raises(L.LayoutError):
            L.wanted(L.explicit([L.Entry("all", True, devices)]), 0, RTX)
    L.check_profile("1g.24gb+me.all")
    with pytest.raises(L.LayoutError):
        L.check_profile("1g.24gb+foo")
