"""The version matrix (gpuk8s/data/versions.yaml): its shape and rules, the single-source rule, `gpuk8s versions`."""

from __future__ import annotations

import io
import json
import re
import tokenize
from datetime import date
from pathlib import Path

import pytest
import yaml

from gpuk8s import mirrors, ui, versions
from gpuk8s.commands import versions as versions_cmd
from gpuk8s.inventory import loads
from gpuk8s.options import Output

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "gpuk8s" / "data" / "versions.yaml"
M = versions.matrix()
DAY = date(2026, 11, 30)  # the day the matrix was checked (issue 16): judged on a fixed date, not the calendar


def number(minor: str) -> int:
    return int(minor.split(".")[1])


# --- the matrix ----------------------------------------------------------------------------------------------


def test_the_matrix_is_the_shipped_file_and_was_checked():
    assert versions.parse_matrix(MATRIX.read_text()) == M
    assert M.checked >= DAY  # checked again later: fine; the tests below judge end of life on DAY


def test_minors_are_contiguous_from_129_to_the_newest_and_include_the_labs():
    ns = [number(k) for k in M.minors]
    assert ns == sorted(ns, reverse=True) == list(range(ns[0], 28, -1))  # newest first, 1.29 .. newest
    assert "1.30" in M.minors  # the lab builds 1.30 (tests/lab/lab.py): it must stay accepted
    # preflight's Docker verdict assumes no dockershim (gone in 1.24) and every floor assumes CRI v1 (1.26)
    assert min(ns) >= 26


def test_the_default_is_the_newest_minor_with_at_least_two_patch_releases():
    assert M.default == versions.default_by_rule(M) == versions.default_minor()
    newer = [k for k in M.minors.values() if number(k.minor) > number(M.default)]
    # each newer minor has had fewer than two patches, or needs a containerd install cannot set up yet
    assert all(k.patch_releases < 2 or int(k.containerd_floor.split(".")[0]) > M.containerd_installable
               for k in newer)
    assert M.minors[M.default].patch_releases >= 2
    assert not M.minors[M.default].end_of_life_reached(DAY)


def test_the_rule_moves_the_default_when_a_newer_minor_gets_its_second_patch():
    data = yaml.safe_load(MATRIX.read_text())
    newest = next(iter(M.minors))
    data["kubernetes"]["minors"][newest]["latest_patch"] = f"{newest}.2"
    data["kubernetes"]["containerd_installable"] = 2  # once install brings containerd to 2.x
    bumped = versions.parse_matrix(yaml.safe_dump(data))
    assert versions.default_by_rule(bumped) == newest  # and the test above then asks for the default to move


def test_end_of_life_dates_and_latest_patches():
    eol = {k.minor: k.end_of_life.isoformat() for k in M.minors.values()}
    # kubernetes.io/releases and kubernetes/website data/releases/eol.yaml
    assert {m: eol[m] for m in ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")} == {
        "1.29": "2025-02-28", "1.30": "2025-07-15", "1.31": "2025-11-11", "1.32": "2026-02-28",
        "1.33": "2026-06-28", "1.34": "2026-10-27", "1.35": "2027-02-28", "1.36": "2027-06-28",
        "1.37": "2027-10-28"}
    assert [k.minor for k in versions.end_of_life_minors(DAY)] == ["1.34", "1.33", "1.32", "1.31", "1.30", "1.29"]
    for k in M.minors.values():
        assert k.latest_patch.startswith(k.minor + ".")


def test_kubeadm_api_and_containerd_floor_per_minor():
    for k in M.minors.values():
        # kubeadm 1.31 enabled v1beta4 (and deprecated v1beta3); before 1.31 there is no v1beta4
        assert k.kubeadm_api == ("kubeadm.k8s.io/v1beta4" if number(k.minor) >= 31 else "kubeadm.k8s.io/v1beta3")
        floor = versions.release(k.containerd_floor)
        # 1.35 was the last minor to support containerd 1.x; CRI v1 needs containerd 1.6.15 (1.26+)
        assert floor == ((2, 0) if number(k.minor) >= 36 else (1, 6, 15)), k.minor
        assert all(versions.at_least(versions.release(t), floor) for t in k.containerd_tested), k.minor


def test_pins_are_well_formed_and_every_cni_manifest_is_pinned_by_sha256():
    sets = M.pin_sets()
    assert set(sets) == {k.pins.name for k in M.minors.values()}
    for p in sets.values():
        assert re.fullmatch(r"v[0-9]+\.[0-9]+\.[0-9]+", p.device_plugin)
        assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+-1", p.toolkit)  # NVIDIA's packages: X.Y.Z-1
        assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+-[0-9]+\.[0-9]+\.[0-9]+-(distroless|ubuntu22\.04|ubi9)",
                            p.dcgm_exporter)
        assert p.calico.url == f"https://raw.githubusercontent.com/projectcalico/calico/{p.calico.version}/manifests/" \
                               "calico.yaml"
        assert p.flannel.url == f"https://github.com/flannel-io/flannel/releases/download/{p.flannel.version}/" \
                                "kube-flannel.yml"
        for pin in (p.calico, p.flannel):
            assert versions.DEFAULT_MANIFEST_SHA256[pin.url] == pin.sha256
    # the pins issue 16 asked for, with the sha256 computed from the real bytes
    assert {(pin.version, pin.sha256) for p in sets.values() for pin in (p.calico, p.flannel)} == {
        ("v3.28.0", "93e7f39c3f93f9dc67ee2386aa7240d8d13ff62e54535a2f5f6432e8c6c0f24f"),
        ("v3.31.7", "d6d8a489a4ed8e5b8efd8b339047b496ca657b55ee2e3618e791507b0a853e8d"),
        ("v3.32.1", "a1df919d9721cf667accdc3e72848911b0cb25cfab7d2478ad0c996302c95744"),
        ("v0.25.5", "a15d73cbe14e96287f42ffb16d5995930f92b263f4794797e3a2fa30ec885803"),
        ("v0.28.9", "1c06a15a771009c263bdb1f51c928af46f7606fe969f3963652167938d536aaa")}


def test_supported_minors_get_current_pins_and_end_of_life_ones_keep_theirs():
    default = versions.pins()
    assert default == M.minors[M.default].pins
    for k in M.minors.values():
        if not k.end_of_life_reached(DAY):
            assert (k.pins.device_plugin, k.pins.toolkit) == (default.device_plugin, default.toolkit), k.minor


def test_the_labs_minor_installs_what_the_lab_serves():
    """The lab's inventory pins a minor and its fake repository serves a few toolkit versions: the matrix's
    pins for that minor must be among them (tests/lab is read, not changed)."""
    lab = (ROOT / "tests" / "lab" / "lab.py").read_text()
    minor = re.search(r'"kubernetes_version": "([0-9.]+)"', lab)
    served = re.search(r"^TOOLKIT_VERSIONS = \(([^)]*)\)", (ROOT / "tests" / "lab" / "fakes" / "fake.py").read_text(),
                       re.M)
    assert minor and served
    assert minor.group(1) in M.minors
    assert versions.pins(minor.group(1)).toolkit in re.findall(r'"([^"]+)"', served.group(1))


@pytest.mark.parametrize(("edit", "complaint"), [
    (lambda d: d["kubernetes"].update(default="1.99"), "kubernetes.default: 1.99 is not in kubernetes.minors"),
    (lambda d: d["kubernetes"]["minors"]["1.30"].update(pins="nope"), "no pin set 'nope'"),
    (lambda d: d["kubernetes"]["minors"]["1.30"].update(latest_patch="1.31.2"), "is not a patch release of 1.30"),
    (lambda d: d["kubernetes"]["minors"]["1.30"].update(kubeadm_api="v1beta4"), "is not a kubeadm configuration API"),
    (lambda d: d["kubernetes"]["minors"]["1.30"].pop("end_of_life"), "end_of_life is missing"),
    (lambda d: d["pins"]["current"]["calico"].update(sha256="ABC"), "sha256: not 64 lowercase"),
    (lambda d: d["pins"]["current"]["calico"].update(version="v9.9.9"), "must be an https URL of version v9.9.9"),
    (lambda d: d.update(cuda_test_images=["nvcr.io/nvidia/cuda:99.0-base"]), "names no CUDA version"),
    (lambda d: d["kubernetes"]["minors"].update({1.3: {}}), "a minor is written as a quoted"),
])
def test_a_malformed_matrix_is_refused_with_what_is_wrong(edit, complaint):
    data = yaml.safe_load(MATRIX.read_text())
    edit(data)
    with pytest.raises(versions.MatrixError, match=re.escape(complaint)):
        versions.parse_matrix(yaml.safe_dump(data))


# --- the single-source rule ------------------------------------------------------------------------------------

# A version-like token: 1.N, 1.N.P, v0.20.1, 1.20.0-1, 4.6.0-4.8.3-distroless, 13.0.0-base-ubuntu22.04.
_TOKEN = re.compile(r"(?<![\w.])v?[0-9]+(?:\.[0-9]+)+(?:-[0-9A-Za-z][0-9A-Za-z.-]*)?(?!\w)")
_HEX64 = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


def matrix_strings() -> set[str]:
    out: set[str] = set()
    for k in M.minors.values():
        out |= {k.minor, k.latest_patch, k.containerd_floor, *k.containerd_tested}
    for p in M.pin_sets().values():
        out |= {p.device_plugin, p.toolkit, p.calico.version, p.flannel.version, p.dcgm_exporter}
    out |= {img.rpartition(":")[2] for img in M.cuda_test_images}
    out.add(versions.cri_dockerd().version)
    return out


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) to search: for Python its strings and comments (a float literal 2.0 is no version)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    return [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type in (tokenize.STRING, tokenize.COMMENT)]


def violations(rel: str) -> list[str]:
    strings = matrix_strings()
    hashes = {pin.sha256 for p in M.pin_sets().values() for pin in (p.calico, p.flannel)}
    hashes |= set(versions.cri_dockerd().sha256.values())
    apis = {k.kubeadm_api for k in M.minors.values()}
    out = []
    for line, text in _texts(ROOT / rel):
        found = {t for t in _TOKEN.findall(text) if t in strings or t.removeprefix("v") in strings}
        found |= set(_HEX64.findall(text)) & hashes
        found |= {a for a in apis if a in text}
        out += [f"{rel}:{line}: {t}" for t in sorted(found)]
    return out


def scanned_files() -> list[str]:
    files = []
    for top in ("gpuk8s", "playbooks"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc",):
                files.append(p.relative_to(ROOT).as_posix())
    return [f for f in files if f != "gpuk8s/data/versions.yaml"]


def test_no_version_of_the_matrix_is_written_anywhere_else_in_gpuk8s_or_playbooks():
    files = scanned_files()
    assert "gpuk8s/inventory/model.py" in files and "playbooks/containerd.yaml" in files
    found = [v for f in files for v in violations(f)]
    assert found == [], "version strings of gpuk8s/data/versions.yaml written elsewhere (read them from " \
                        "gpuk8s.versions instead):\n" + "\n".join(found)


def test_the_rule_would_catch_a_hard_coded_pin(tmp_path):
    assert _TOKEN.findall('toolkit_version: str = "1.20.0-1"  # was 1.17.8-1') == ["1.20.0-1", "1.17.8-1"]
    assert _TOKEN.findall("image: nvcr.io/nvidia/cuda:13.0.0-base-ubuntu22.04") == ["13.0.0-base-ubuntu22.04"]
    assert _TOKEN.findall("1.30.2-1.1 and 12.2.2 and /v1.30/deb") == ["1.30.2-1.1", "12.2.2", "v1.30"]
    assert versions.pins().toolkit in matrix_strings() and M.default in matrix_strings()


# --- inventory defaults and the CNI pins -------------------------------------------------------------------------


@pytest.mark.parametrize("minor", list(M.minors))
def test_every_minor_loads_with_its_pins_and_its_manifests_pinned(minor):
    inv = loads(f'cluster: {{kubernetes_version: "{minor}"}}\nhosts: [{{name: cp, address: 10.0.0.1, '
                'role: control-plane}]\n')
    p = versions.pins(minor)
    assert (inv.install.toolkit_version, inv.install.device_plugin_version) == (p.toolkit, p.device_plugin)
    assert (inv.install.calico_manifest, inv.install.flannel_manifest) == (p.calico.url, p.flannel.url)
    assert mirrors.manifest_sha256(inv, "calico") == p.calico.sha256
    assert mirrors.manifest_sha256(inv, "flannel") == p.flannel.sha256


# --- gpuk8s versions ---------------------------------------------------------------------------------------------


def test_versions_table_names_the_default_and_the_minors_past_end_of_life(monkeypatch, capsys):
    monkeypatch.setattr(ui, "is_terminal", lambda: False)
    monkeypatch.setattr(versions, "today", lambda: DAY)
    versions_cmd.show(Output.table)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# Kubernetes minors (the matrix was checked on 2026-11-30; today is 2026-11-30)"
    assert out[1].split("\t") == ["minor", "latest patch", "end of life", "status", "kubeadm API", "containerd",
                                  "containerd recommends", "pins"]
    rows = {line.split("\t")[0]: line.split("\t") for line in out[2:2 + len(M.minors)]}
    assert list(rows) == list(M.minors)
    assert rows[M.default][3] == "supported, default"
    assert rows["1.30"][1:6] == ["1.30.14", "2025-07-15", "END OF LIFE", "v1beta3", ">= 1.6.15"]
    assert rows["1.36"][5] == ">= 2.0"
    assert f"default: Kubernetes {M.default} (cluster.kubernetes_version chooses another minor of the table)" in out
    assert out[-1] == ("past end of life (installed with the preflight warning k8s.version-eol): 1.34 (2026-10-27), "
                       "1.33 (2026-06-28), 1.32 (2026-02-28), 1.31 (2025-11-11), 1.30 (2025-07-15), 1.29 (2025-02-28)")
    pins = out.index("# Pins (install.* in the inventory overrides each)")
    assert out[pins + 1].split("\t")[:4] == ["pins", "for minors", "device plugin", "container toolkit"]


def test_versions_json(run_cli):
    r = run_cli("versions", "-o", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    day = date.fromisoformat(out["today"])
    assert out == versions.to_json(day)
    assert out["default"] == M.default and [m["minor"] for m in out["minors"]] == list(M.minors)
    assert out["end_of_life"] == [k.minor for k in versions.end_of_life_minors(day)]
    one = next(m for m in out["minors"] if m["minor"] == "1.30")
    assert one["end_of_life"] == "2025-07-15" and one["end_of_life_reached"] is (day >= date(2025, 7, 15))
    assert set(one) >= {"kubeadm_api", "containerd_floor", "device_plugin", "toolkit", "calico", "flannel",
                        "dcgm_exporter", "latest_patch", "pins", "default"}
    assert run_cli("versions").returncode == 0
    assert "versions" in run_cli("--help").stdout


# --- the docs show the matrix as it is -------------------------------------------------------------------------


def markdown_table() -> str:
    rows = ["| minor | latest patch | end of life | kubeadm API | containerd | device plugin | container toolkit "
            "| Calico | Flannel | DCGM exporter |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k in M.minors.values():
        minor = f"**{k.minor}** (default)" if k.minor == M.default else k.minor
        p = k.pins
        rows.append(f"| {minor} | {k.latest_patch} | {k.end_of_life.isoformat()} | {k.kubeadm_api.rsplit('/')[1]} "
                    f"| >= {k.containerd_floor} | {p.device_plugin} | {p.toolkit} | {p.calico.version} "
                    f"| {p.flannel.version} | {p.dcgm_exporter} |")
    return "\n".join(rows)


def test_docs_versions_md_shows_the_matrix():
    doc = (ROOT / "docs" / "versions.md").read_text()
    block = re.search(r"<!-- matrix:begin -->\n(.*?)\n<!-- matrix:end -->", doc, re.S)
    assert block, "docs/versions.md lost its <!-- matrix:begin/end --> block"
    assert block.group(1) == markdown_table(), "docs/versions.md is out of date; its table is:\n" + markdown_table()


def test_readme_names_the_default_versions():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Versions"):]
    section = section[:section.index("\n## ", 1)]
    p = versions.pins()
    for s in (f"Kubernetes {M.default}", p.device_plugin, p.toolkit, p.calico.version, p.flannel.version,
              "docs/versions.md", "gpuk8s versions", "kubernetes_version"):
        assert s in section, s


# --- CUDA and the driver (versions.yaml's cuda section) ---------------------------------------------------------


def test_the_cuda_driver_floors_are_the_release_notes_table_per_minor():
    # NVIDIA's CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions" (table 3), Linux x86_64
    table = {"13.1": "590.44.01", "13.0": "580.65.06", "12.9": "575.51.03", "12.8": "570.26", "12.6": "560.28.03",
             "12.5": "555.42.02", "12.4": "550.54.14", "12.3": "545.23.06", "12.2": "535.54.03", "12.1": "530.30.02",
             "12.0": "525.60.13", "11.8": "520.61.05", "11.0": "450.36.06", "10.1": "418.39"}
    for cuda, driver in table.items():
        floor = versions.cuda_driver_floor(cuda)
        assert floor is not None and floor.exact and floor.text == driver and versions.fmt(floor.driver) == \
            ".".join(str(int(x)) for x in driver.split(".")), cuda
    # the case: a minor's requirement is its own floor, not the major's (12.x -> 525.60.13)
    assert versions.cuda_driver_floor("12.6").text == "560.28.03"
    assert not versions.at_least((535, 104, 5), versions.cuda_driver_floor("12.6").driver)
    # a minor newer than the table: the newest known one's floor, marked as a lower bound
    newer = versions.cuda_driver_floor("13.9")
    assert newer is not None and not newer.exact and newer.known == next(iter(dict(versions.CUDA_MINOR_FLOORS)))
    assert versions.cuda_driver_floor("8.0") is None and versions.cuda_driver_floor("x") is None
    assert versions.cuda_of_driver((535, 104, 5)) == "12.2" and versions.cuda_of_driver((580, 95, 5)) == "13.0"


def test_the_major_floors_are_unchanged_for_preflight_and_the_test_image():
    assert versions.CUDA_DRIVER_FLOORS == (("13", (580, 0)), ("12", (525, 60, 13)), ("11", (450, 80, 2)),
                                           ("10.2", (440, 33)), ("10.1", (418, 39)), ("10.0", (410, 48)),
                                           ("9.0", (384, 81)))


@pytest.mark.parametrize("edit", [
    lambda d: d.pop("cuda"),
    lambda d: d["cuda"]["driver_per_minor"].update({"12.6": "latest"}),
    lambda d: d["cuda"].update(driver_per_major=[]),
])
def test_a_malformed_cuda_section_is_refused(edit, monkeypatch):
    data = yaml.safe_load(MATRIX.read_text())
    edit(data)

    class Files:
        def joinpath(self, _):
            return self

        def read_text(self, encoding="utf-8"):
            return yaml.safe_dump(data)

    monkeypatch.setattr(versions.resources, "files", lambda _: Files())
    versions._document.cache_clear()  # versions.yaml is read once per run: this test's copy is read anew
    try:
        with pytest.raises(versions.MatrixError, match="cuda"):
            versions._cuda_section()
    finally:
        versions._document.cache_clear()


def test_versions_yaml_is_parsed_once_for_every_section(monkeypatch):
    """Each section's reader parsed the whole file again (one at import, in Python's YAML loader): now once."""
    parsed = []
    real = versions._load_matrix_yaml
    monkeypatch.setattr(versions, "_load_matrix_yaml", lambda text: (parsed.append(1), real(text))[1])
    versions._document.cache_clear()
    for f in (versions.matrix, versions.cri_dockerd, versions.monitoring_images, versions.hami,
              versions._cni_images, versions._cuda_tables):
        f.cache_clear()
    try:
        versions.matrix(), versions.cri_dockerd(), versions.monitoring_images(), versions.hami()
        versions._cni_images(), versions._cuda_tables()
        assert parsed == [1]
    finally:
        versions._document.cache_clear()
