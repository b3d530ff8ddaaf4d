"""The kind workflow (.github/workflows/kind.yml) against the version matrix (gpuk8s/data/versions.yaml): the one
place that fails when the Kubernetes minors the kind jobs run and the minors gpuk8s supports disagree.

Supported: the matrix's minors not past end of life on the day the matrix was checked (`checked`), so that the
verdict changes with the matrix, never with the calendar. Each job's node image must be a kindest/node image
pinned by digest and quoted, with that digest, in a comment of the workflow (from kind's release notes, whose URL
for the workflow's kind version must be there too); kubectl must be the node's minor (kubectl supports one minor
of skew; the node's own release is used); kind must be v0.33.0 or newer (the first release with images of 1.37).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpuk8s import versions

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "kind.yml"
MATRIX = ROOT / "gpuk8s" / "data" / "versions.yaml"
KIND_FLOOR = (0, 33, 0)
IMAGE = re.compile(r"kindest/node:v(?P<minor>1\.[0-9]+)\.[0-9]+@sha256:(?P<digest>[0-9a-f]{64})")
RELEASE_NOTES = "https://github.com/kubernetes-sigs/kind/releases/tag/"


def supported(m: versions.Matrix) -> set[str]:
    return {k for k, v in m.minors.items() if not v.end_of_life_reached(m.checked)}


def release(text: str) -> tuple[int, ...] | None:
    return tuple(int(x) for x in text[1:].split(".")) if re.fullmatch(r"v[0-9]+\.[0-9]+\.[0-9]+", text) else None


def problems(text: str, minors: set[str]) -> list[str]:
    """What is wrong with the workflow `text` for the supported `minors`; [] when nothing is."""
    out: list[str] = []
    job = yaml.safe_load(text)["jobs"]["kind"]
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    entries = job["strategy"]["matrix"].get("include") or []
    seen: dict[str, str] = {}
    for e in entries:
        image, kubectl = str(e.get("node_image", "")), str(e.get("kubectl_version", ""))
        m = IMAGE.fullmatch(image)
        if m is None:
            out.append(f"{image or e}: not a kindest/node image pinned by digest (kindest/node:vX.Y.Z@sha256:...)")
            continue
        minor = m.group("minor")
        if minor in seen:
            out.append(f"{image}: a second job for {minor} (with {seen[minor]})")
        seen[minor] = image
        if image not in comments:
            out.append(f"{image}: not quoted in a comment of the workflow (copy it from kind's release notes)")
        if versions.minor_of(kubectl) != minor or release(kubectl) is None:
            out.append(f"{image}: kubectl_version {kubectl!r} is not a {minor} release")
    for minor in sorted(minors - set(seen), key=lambda k: int(k.split(".")[1])):
        out.append(f"no kind job for {minor}, a minor gpuk8s supports (gpuk8s/data/versions.yaml)")
    for minor in sorted(set(seen) - minors, key=lambda k: int(k.split(".")[1])):
        out.append(f"a kind job for {minor} ({seen[minor]}), a minor gpuk8s does not support or past end of life")
    steps = [s for s in job["steps"] if str(s.get("uses", "")).startswith("helm/kind-action@")]
    if len(steps) != 1:
        out.append(f"{len(steps)} helm/kind-action steps: one expected")
    else:
        w = steps[0].get("with") or {}
        v = release(str(w.get("version", "")))
        if v is None or v < KIND_FLOOR:
            out.append(f"kind {w.get('version')!r}: v{'.'.join(map(str, KIND_FLOOR))} or newer expected")
        elif f"{RELEASE_NOTES}{w['version']}" not in comments:
            out.append(f"the release notes of kind {w['version']} ({RELEASE_NOTES}{w['version']}) are not quoted")
        if w.get("node_image") != "${{ matrix.node_image }}" or w.get("kubectl_version") != \
                "${{ matrix.kubectl_version }}":
            out.append("helm/kind-action does not take node_image and kubectl_version from the matrix")
    return out


TEXT = WORKFLOW.read_text()
MINORS = supported(versions.matrix())


def test_the_kind_workflow_runs_every_supported_minor_pinned_by_digest():
    # 1.35, 1.36 and 1.37 for the matrix checked 2026-11-30; the default is always among them
    assert versions.matrix().default in MINORS
    assert problems(TEXT, MINORS) == []


def without_minor(text: str, minor: str) -> str:
    """The workflow with the job of `minor` removed (its two lines under include:)."""
    lines = text.splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if line.lstrip().startswith(f"- node_image: kindest/node:v{minor}."))
    assert "kubectl_version" in lines[i + 1]
    return "".join(lines[:i] + lines[i + 2:])


def test_a_minor_removed_from_the_workflow_fails():
    got = problems(without_minor(TEXT, "1.35"), MINORS)
    assert got == ["no kind job for 1.35, a minor gpuk8s supports (gpuk8s/data/versions.yaml)"]


def test_a_minor_the_matrix_gains_fails_until_the_workflow_has_it():
    data = yaml.safe_load(MATRIX.read_text())
    newest = next(iter(versions.matrix().minors))
    nxt = f"1.{int(newest.split('.')[1]) + 1}"
    data["kubernetes"]["minors"][nxt] = {**data["kubernetes"]["minors"][newest], "latest_patch": f"{nxt}.0"}
    m = versions.parse_matrix(yaml.safe_dump(data))
    assert problems(TEXT, supported(m)) == [f"no kind job for {nxt}, a minor gpuk8s supports "
                                            "(gpuk8s/data/versions.yaml)"]


def test_an_end_of_life_minor_in_the_workflow_fails():
    old = ("          - node_image: kindest/node:v1.31.2@sha256:"
           "18fbefc20a7113353c7b75b5c869d7145a6abd6269154825872dc59c1329912e\n"
           "            kubectl_version: v1.31.2\n")
    text = TEXT.replace("        include:\n", "        include:\n" + old, 1)
    got = problems(text, MINORS)
    assert any(p.startswith("a kind job for 1.31 ") for p in got), got
    assert any("not quoted in a comment" in p for p in got), got


@pytest.mark.parametrize("change, expected", [
    # a tag without its digest
    (lambda t: re.sub(r"(- node_image: kindest/node:v1\.36\.4)@sha256:[0-9a-f]{64}", r"\1", t),
     "not a kindest/node image pinned by digest"),
    # a digest that is not the one quoted from the release notes
    (lambda t: t.replace("- node_image: kindest/node:v1.37.0@sha256:a1ed",
                         "- node_image: kindest/node:v1.37.0@sha256:b1ed"), "not quoted in a comment"),
    (lambda t: t.replace("version: v0.33.0", "version: v0.25.0"), "v0.33.0 or newer expected"),
    (lambda t: t.replace("kubectl_version: v1.35.8", "kubectl_version: v1.37.0"), "is not a 1.35 release"),
    (lambda t: t.replace(RELEASE_NOTES + "v0.33.0", "the release notes"), "are not quoted"),
])
def test_a_changed_workflow_fails(change, expected):
    text = change(TEXT)
    assert text != TEXT
    got = problems(text, MINORS)
    assert any(expected in p for p in got), got
