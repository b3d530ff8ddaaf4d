"""The MIG parsers (gpuk8s/facts/mig.py) on modelled and lab outputs (tests/fixtures/mig/README.md says
which), the probe's mig section, and the property: any text gives a value or mig.ParseError."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.facts import mig
from gpuk8s.facts.parse import parse_probe

FIX = Path(__file__).resolve().parent.parent / "fixtures"
MIG = FIX / "mig"


def read(name: str) -> str:
    return (MIG / name).read_text()


def test_lgip_of_an_a100_80gb_lists_the_guide_profiles():
    rows = mig.parse_lgip(read("a100-80gb-lgip.txt"))
    assert [(r.name, r.id, r.free, r.total) for r in rows] == [
        ("1g.10gb", 19, 7, 7), ("1g.10gb+me", 20, 1, 1), ("1g.20gb", 15, 4, 4), ("2g.20gb", 14, 3, 3),
        ("3g.40gb", 9, 2, 2), ("4g.40gb", 5, 1, 1), ("7g.80gb", 0, 1, 1)]
    assert rows[4].memory_gib == "39.25" and {r.gpu for r in rows} == {0}


def test_lgip_of_the_lab_h200_after_two_3g_71gb_has_no_room_left():
    rows = mig.parse_lgip(read("h200-lgip.txt"))
    assert [r.name for r in rows if r.gpu == 0] == ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb",
                                                    "4g.71gb", "7g.141gb"]
    assert all(r.free == 0 for r in rows) and {r.gpu for r in rows} == {0, 1}


def test_lgi_and_lci_tables():
    gis = mig.parse_lgi(read("a100-80gb-lgi.txt"))
    assert [(g.gpu, g.profile, g.profile_id, g.id, g.placement) for g in gis] == [
        (0, "4g.40gb", 5, 1, "0:4"), (0, "3g.40gb", 9, 2, "4:4")]
    cis = mig.parse_lci(read("a100-80gb-lci.txt"))
    assert [(c.gpu, c.gi, c.profile, c.profile_id, c.id) for c in cis] == [
        (0, 1, "4g.40gb", 3, 0), (0, 2, "3g.40gb", 2, 0)]
    h = mig.parse_lgi(read("h200-lgi.txt"))
    assert [(g.gpu, g.profile) for g in h] == [(0, "3g.71gb"), (0, "3g.71gb"), (1, "3g.71gb"), (1, "3g.71gb")]
    assert len(mig.parse_lci(read("h200-lci.txt"))) == 4


def test_nothing_found_is_an_empty_list_and_other_text_an_error():
    assert mig.parse_lgi("No GPU instances found: Not Found\n") == ()
    assert mig.parse_lci("No compute instances found: Not Found") == ()
    assert mig.parse_lgip("No MIG-enabled devices found.\n") == ()
    with pytest.raises(mig.ParseError):
        mig.parse_lgi("Failed to initialize NVML: Unknown Error\n")
    with pytest.raises(mig.ParseError):  # a row that is not a GPU instance
        mig.parse_lgi(read("a100-80gb-lgi.txt").replace("MIG 3g.40gb", "XYZ 3g.40gb"))


def test_modes_list_and_processes():
    assert mig.parse_modes(read("modes.txt")) == (
        (0, "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763", "Enabled", "Enabled"),
        (1, "GPU-1a2b3c4d-0000-4b17-9c2e-5da9abb51763", "Disabled", "Enabled"))
    assert mig.parse_modes(read("modes-l4.txt"))[0][2:] == ("[N/A]", "[N/A]")
    with pytest.raises(mig.ParseError):
        mig.parse_modes('Field "mig.mode.pending" is not a valid field to query.\n')
    devs = mig.parse_list(read("a100-80gb-list.txt"))
    assert [p for p, _ in devs[0]] == ["4g.40gb", "3g.40gb"] and devs[1] == ()
    assert [p for p, _ in mig.parse_list(read("h200-list.txt"))[1]] == ["3g.71gb", "3g.71gb"]
    apps = mig.parse_compute_apps(read("compute-apps.txt"))
    assert [(a.pid, a.name) for a in apps] == [(4242, "python3"), (4343, "/usr/bin/dcgm-exporter")]
    assert mig.parse_compute_apps("") == ()


def _section(parts: dict[str, tuple[int, str]]) -> str:
    return "".join(f"@@mig {k} {rc}\n{text}\n" for k, (rc, text) in parts.items())


def test_the_probe_section_joins_everything_per_gpu():
    text = _section({"mode": (0, read("modes.txt")), "lgip": (0, read("a100-80gb-lgip.txt")),
                     "lgi": (0, read("a100-80gb-lgi.txt")), "lci": (0, read("a100-80gb-lci.txt")),
                     "apps": (0, read("compute-apps.txt"))})
    f = mig.parse_section(text)
    assert f.state == "ok" and [g.index for g in f.gpus] == [0, 1]
    g0, g1 = f.gpus
    assert [i.profile for i in g0.instances] == ["4g.40gb", "3g.40gb"] and len(g0.computes) == 2
    assert len(g0.processes) == 2 and g1.processes == () and g1.instances == ()
    assert (g1.current, g1.pending) == ("Disabled", "Enabled") and g1.capable
    # through the whole probe parser too
    probe = f"@@gpuk8s-begin mig\n{text}\n@@gpuk8s-end mig 0\n"
    assert parse_probe(probe).mig == f
    absent = "@@gpuk8s-begin mig\nnvidia-smi: command not found\n@@gpuk8s-end mig 127\n"
    assert parse_probe(absent).mig.state == "absent"


def test_a_failing_mode_query_or_listing_is_a_failed_state_with_the_reason():
    f = mig.parse_section(_section({"mode": (6, "No devices were found")}))
    assert f.state == "failed" and "No devices were found" in f.error
    f = mig.parse_section(_section({"mode": (0, read("modes.txt")), "lgi": (9, "NVIDIA-SMI has failed")}))
    assert f.state == "failed" and "NVIDIA-SMI has failed" in f.error
    # "nothing found" with a non-zero status is not a failure
    f = mig.parse_section(_section({"mode": (0, read("modes.txt")), "lgi": (6, "No GPU instances found: Not Found")}))
    assert f.state == "ok"


def test_the_real_h200_probe_without_mig_section_has_default_mig_facts():
    f = parse_probe((FIX / "h200" / "probe.txt").read_text())
    assert f.mig.state == "absent" and f.mig.gpus == ()


texts = st.one_of(
    st.text(max_size=400),
    st.lists(st.sampled_from(["|", "=", "+", "-", " ", "\n", "MIG", "1g.10gb", "19", "7/7", "9.75", "0:1", "No",
                              "GPU instance profiles:", "GPU instances:", "Compute instances:", ",", "Enabled",
                              "[N/A]", "@@mig mode 0\n", "@@mig lgi 0\n", "@@mig apps 0\n", "0", "²", "GPU 0: x",
                              "  MIG 1g.10gb  Device  0: (UUID: MIG-1)"]), max_size=80).map("".join),
)


@settings(max_examples=300)
@given(texts)
def test_every_mig_parser_returns_a_value_or_its_parse_error(text: str) -> None:
    for fn in (mig.parse_lgip, mig.parse_lgi, mig.parse_lci, mig.parse_modes, mig.parse_compute_apps,
               mig.parse_list):
        with contextlib.suppress(mig.ParseError):
            fn(text)
    mig.split(text)
    f = mig.parse_section(text)  # never raises
    assert f.state in ("ok", "failed")
