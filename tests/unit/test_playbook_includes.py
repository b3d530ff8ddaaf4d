"""Shared steps and blocks of the playbooks (playbooks/_shared.yaml, issue 29): the steps that use them render the
commands their written-out copies did, for a matrix of inventories and hosts; a wrong name, a missing or unknown
param, or a missing block is a PlaybookError naming the playbook and the step, when the playbook is loaded."""

from __future__ import annotations

import hashlib
import itertools
import shutil
from dataclasses import replace
from typing import Any

import pytest
import yaml

from gpuk8s.inventory.loader import loads
from gpuk8s.playbook import model, render
from gpuk8s.playbook.model import PlaybookError, load_playbook, parse_playbook, parse_shared, playbook_names
from gpuk8s.playbook.render import RenderedStep, context, render_playbook
from tests.unit.test_checks import CONTAINERD_17, CP, HOST, facts
from tests.unit.test_playbooks import ALINUX, FP_A, FP_B, KEY_A, KEY_B, run_key_step

PLAYBOOKS = ["kubernetes-prerequisites", "nvidia-container-toolkit", "containerd", "docker", "cri-dockerd"]
FP_C = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
# Every repository's URL written out (no default of the loader's in the rendering), pinned or not, over http or not
REPOS: dict[str, dict[str, Any]] = {
    "unpinned": {"toolkit_repo": "https://m.lan/nvidia", "kubernetes_repo": "https://m.lan/k8s",
                 "containerd_repo": "https://m.lan/docker"},
    "pinned": {"toolkit_repo": {"url": "https://m.lan/nvidia", "key_fingerprint": FP_A},
               "kubernetes_repo": {"url": "https://m.lan/k8s", "key_fingerprint": FP_B},
               "containerd_repo": {"url": "https://m.lan/docker", "key_fingerprint": FP_C}},
    "http": {"toolkit_repo": {"url": "http://m.lan/nvidia", "insecure_http": True, "key_fingerprint": FP_A},
             "kubernetes_repo": {"url": "http://m.lan/k8s", "insecure_http": True, "key_fingerprint": FP_B},
             "containerd_repo": {"url": "http://m.lan/docker", "insecure_http": True, "key_fingerprint": FP_C}},
}

# sha256 (first 16 hex digits) of what each step that was made shared renders over matrix() below, whitespace
# folded: captured from the playbooks as they were before, with every step written out in full (the six key
# steps, containerd-apt-repo's source list block in its check and its run, the two restart steps). A change of
# one of these means that the commands some host runs changed: make sure it is meant before updating the figure.
WRITTEN_OUT = {
    "containerd-apt-key": "d777010fb28f441c",
    "containerd-apt-repo": "a8e3be7ad4ad3e91",
    "containerd-restarted": "bcc14b0b80baa47b",
    "containerd-rpm-key": "eff69e1f8062c804",
    "docker-restarted": "5565316310dec16f",
    "kubernetes-apt-key": "41bf7d31f4885295",
    "kubernetes-rpm-key": "fd0860401d3a3dac",
    "toolkit-apt-key": "548d595516254856",
    "toolkit-rpm-key": "bf1402dbc038703f",
}


def matrix() -> list[tuple[str, Any, Any, Any]]:
    """(label, inventory, host, facts): repositories x minor (1.36 upgrades containerd 1.7 to containerd.io) x
    runtime x OS x GPU worker or control plane."""
    out = []
    for repos, minor, runtime, os_name, role in itertools.product(REPOS, ["1.30", "1.36"], ["containerd", "docker"],
                                                                  ["ubuntu", "alinux"], ["gpu", "cp"]):
        inv = loads(f'cluster: {{kubernetes_version: "{minor}", container_runtime: {runtime}}}\n'
                    "hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                    "  - {name: gpu-1, address: 10.0.0.11, role: worker, gpus: 8}\n"
                    + yaml.safe_dump({"install": {**REPOS[repos], "containerd_version": "2.2.1-1"}}))
        f = facts(containerd=CONTAINERD_17) if minor == "1.36" else facts()
        if os_name == "alinux":
            f = replace(f, os=ALINUX)
        if role == "cp":
            f = replace(f, gpu=replace(f.gpu, gpus=()))
        out.append((f"{repos} {minor} {runtime} {os_name} {role}", inv, HOST if role == "gpu" else CP, f))
    return out


def fold(text: str) -> str:
    """Whitespace that changes no command: indentation, trailing blanks, empty lines (none of these steps has a
    here-document or a multi-line string whose spacing matters)."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def shown(s: RenderedStep) -> str:
    return "\n".join([s.title, fold(s.check), fold(s.run), repr(s.changes), s.restarts, s.file_path, s.file_content])


def renderings(playbooks: list[model.Playbook]) -> dict[str, list[str]]:
    """Each step's rendering for every host of the matrix (absent where its `when` leaves it out)."""
    out: dict[str, list[str]] = {}
    for label, inv, host, f in matrix():
        ctx = context(inv, host, f)
        for pb in playbooks:
            for s in render_playbook(pb, ctx):
                out.setdefault(s.name, []).append(f"== {label}\n{shown(s)}")
    return out


def digest(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def test_shared_steps_render_the_commands_of_the_copies_they_replaced():
    got = renderings([load_playbook(n) for n in PLAYBOOKS])
    # the matrix reaches every variant: containerd's key steps (an upgrade), pinned rpm keys, Docker hosts
    assert len(got["containerd-apt-key"]) == 3 * 2 and len(got["containerd-rpm-key"]) == 2 * 2
    assert len(got["toolkit-rpm-key"]) == 2 * 2 * 2 and len(got["docker-restarted"]) == len(matrix())
    now = {name: digest(got.get(name, [])) for name in WRITTEN_OUT}
    for name, want in WRITTEN_OUT.items():
        assert now[name] == want, (f"{name} renders other commands than before over the matrix (digests now: "
                                   f"{now}); on its first host:\n{got.get(name, ['(nowhere)'])[0]}")


def test_no_step_writes_the_key_logic_out_again():
    for name in playbook_names():
        for s in load_playbook(name).steps:
            if "--show-keys" in s.check + s.run:
                assert s.use == "repo-key", f"playbooks/{name}.yaml: {s.name} repeats the shared step repo-key"


def test_the_shared_file_is_not_a_playbook():
    assert "_shared" not in playbook_names()
    shared = model.load_shared()
    assert {"repo-key", "service-restarted"} <= set(shared.steps) and "docker-apt-source" in shared.blocks
    assert dict(shared.steps["repo-key"].params)["legacy"] is False  # optional, with its default
    assert dict(shared.steps["repo-key"].params)["url"] is None  # required


# -- a step with use: ----------------------------------------------------------------------------------------------

def pb(steps: str) -> model.Playbook:
    return parse_playbook("name: t\nsteps:\n" + steps, "playbooks/t.yaml")


@pytest.mark.parametrize("steps,message", [
    ("  - {name: a, use: nope}\n", "playbooks/t.yaml: step 1 (a): use: 'nope' is no shared step of "
                                  "playbooks/_shared.yaml (it has: repo-key, service-restarted)"),
    ("  - {name: a, use: repo-key, params: {repo: toolkit, url: u}}\n",
     "playbooks/t.yaml: step 1 (a): use: repo-key needs the param(s) path, format"),
    ("  - {name: a, use: service-restarted, params: {service: x, colour: red}}\n",
     "step 1 (a): use: service-restarted takes no param colour (it takes: service)"),
    ("  - {name: a, use: service-restarted, params: {service: }}\n", "needs the param(s) service"),
    ("  - {name: a, use: service-restarted, params: {service: [x]}}\n",
     "param service must be a string, a number or true/false"),
    ("  - {name: a, use: service-restarted, params: [service]}\n", "params must be a mapping"),
    ("  - {name: a, use: service-restarted, params: {service: x}, check: 'true'}\n",
     "step 1 (a): takes check from the shared step 'service-restarted'"),
    ("  - {name: a, check: 'true', run: 'true', params: {x: 1}}\n", "step 1 (a): params go with use:"),
    ("  - {name: ok, check: 'true', run: 'true'}\n  - {name: b, check: \"{% include 'nope' %}\", run: 'true'}\n",
     "playbooks/t.yaml: step 2 (b): include 'nope': no such block in playbooks/_shared.yaml"),
    ("  - {name: b, check: 'true', run: \"{% include name %}\"}\n", "include names its block as a quoted string"),
    ("  - {name: b, check: 'true', run: \"{% include 'x' \"}\n", "playbooks/t.yaml: step 1"),
])
def test_mistakes_name_the_playbook_and_the_step(steps, message):
    with pytest.raises(PlaybookError) as e:
        pb(steps)
    assert message in str(e.value)


@pytest.mark.parametrize("text,message", [
    ("steps:\n  - {name: a, when: gpu, check: x, run: y}\n", "step 1: unknown keys ['when']"),
    ("steps:\n  - {name: a, use: b}\n", "step 1: unknown keys ['use']"),
    ("steps:\n  - {name: a, params: {Bad-Name: }, check: x, run: y}\n", "step 1 (a): params must map names"),
    ("steps:\n  - {name: a, params: {x: [1]}, check: x, run: y}\n", "param x: a default is a string"),
    ("steps:\n  - {name: a, check: x}\n", "step 1 (a): a command step needs both 'check' and 'run'"),
    ("steps:\n  - {name: a, check: \"{% include 'c' %}\", run: y}\nblocks: {b: x}\n", "include 'c': no such block"),
    ("steps: []\nblocks: {b: \"{% include 'b' %}\"}\n", "block b: a block includes no other block"),
    ("steps: []\nblocks: {B: x}\n", "blocks must map names"),
])
def test_mistakes_in_the_shared_file_name_it_and_the_step(text, message):
    with pytest.raises(PlaybookError) as e:
        parse_shared(text)
    assert str(e.value).startswith("playbooks/_shared.yaml: ") and message in str(e.value)


SHARED = """
steps:
  - name: greet
    params: {who: , loud: false, times: 2}
    title: "greet {{ params.who }}"
    changes: ["/tmp/{{ params.who }}"]
    check: "false"
    run: |
      {% include 'hello' %}
      {%- if params.loud %}
      echo LOUD
      {%- endif %}
      n={{ params.times }}
  - name: broken
    check: "{{ nothing }}"
    run: "true"
blocks:
  hello: "echo hello {{ params.who }} on {{ host.name }}"
"""


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> model.Shared:
    """Shared steps and blocks of this test's own instead of the shipped file (the loader and the renderer read it
    through load_shared)."""
    s = parse_shared(SHARED)
    monkeypatch.setattr(model, "load_shared", lambda: s)
    monkeypatch.setattr(render, "load_shared", lambda: s)
    return s


def test_params_are_rendered_per_host_and_quoted_in_check_and_run(shared):
    p = pb("  - name: a\n    use: greet\n    when: gpu\n    params: {who: \"{{ host.name }}'s $(id)\", loud: true}\n"
           "  - {name: b, use: greet, title: mine, params: {who: x, times: 3}, restarts: svc}\n")
    a, b = p.steps
    assert (a.use, a.title, a.when, dict(a.params)) == ("greet", "greet {{ params.who }}", "gpu", {
        "who": "{{ host.name }}'s $(id)", "loud": True, "times": 2})
    ctx = {"host": {"name": "w-1"}, "gpu": True}
    ra, rb = render_playbook(p, ctx)
    assert ra.title == "greet w-1's $(id)" and ra.changes == ("/tmp/w-1's $(id)",)
    # the value of a param is shell-quoted where check or run use it, in the block it includes too
    assert ra.run == "echo hello 'w-1'\"'\"'s $(id)' on w-1\necho LOUD\nn=2"
    assert (rb.title, rb.run, rb.restarts) == ("mine", "echo hello x on w-1\nn=3", "svc")
    assert [s.name for s in render_playbook(p, {**ctx, "gpu": False})] == ["b"]


def test_a_shared_steps_template_error_names_the_playbook_the_step_and_the_shared_step(shared):
    with pytest.raises(PlaybookError, match=r"playbooks/t\.yaml: c \(use: broken\): UndefinedError"):
        render_playbook(pb("  - {name: c, use: broken}\n"), {})
    with pytest.raises(PlaybookError, match=r"playbooks/t\.yaml: a \(use: greet\): params.who: UndefinedError"):
        render_playbook(pb("  - {name: a, use: greet, params: {who: '{{ nobody }}'}}\n"), {})


def test_params_and_blocks_are_compiled_once_not_per_host():
    playbooks = [load_playbook(n) for n in PLAYBOOKS]

    def render_all(prefix: str) -> None:
        for _, inv, host, f in matrix():
            for p in playbooks:
                render_playbook(p, context(inv, replace(host, name=f"{prefix}-{host.name}"), f))

    render_all("a")
    compiled = render._template.cache_info().misses
    render_all("b")
    assert render._template.cache_info().misses == compiled
    # a block is compiled once per environment too (jinja2's own cache)
    assert render.SHELL_ENV.get_template("docker-apt-source") is render.SHELL_ENV.get_template("docker-apt-source")


# -- containerd's key steps (legacy: their older wording, kept to the letter) with the real gpg ------------------

@pytest.mark.skipif(not shutil.which("gpg"), reason="checks real OpenPGP keys with GnuPG's gpg, which is not "
                    "installed here (apt-get install gnupg; .ci/run installs it)")
@pytest.mark.parametrize("os_name,name,dest", [
    ("ubuntu", "containerd-apt-key", "usr/share/keyrings/gpuk8s-docker.gpg"),
    ("alinux", "containerd-rpm-key", "etc/pki/rpm-gpg/gpuk8s-docker.asc"),
])
def test_containerd_key_steps_check_the_pinned_fingerprint_with_the_real_gpg(os_name, name, dest, tmp_path):
    inv = loads('cluster: {kubernetes_version: "1.36"}\n'
                "hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                "  - {name: gpu-1, address: 10.0.0.11, role: worker, gpus: 8}\n"
                + yaml.safe_dump({"install": {"containerd_version": "2.2.1-1", "containerd_repo": {
                    "url": "http://m.lan/docker", "insecure_http": True, "key_fingerprint": FP_A}}}))
    f = facts(containerd=CONTAINERD_17, os=ALINUX if os_name == "alinux" else facts().os)
    step = {s.name: s for s in render_playbook(load_playbook("containerd"), context(inv, HOST, f))}[name]
    r = run_key_step(step, tmp_path, KEY_B)
    assert r.returncode != 0
    assert f"the key served at http://m.lan/docker/{'ubuntu' if os_name == 'ubuntu' else 'rhel'}/gpg has " \
           f"fingerprint(s) {FP_B}, the inventory pins {FP_A}" in r.stderr
    assert not (tmp_path / dest).exists()
    assert run_key_step(step, tmp_path, KEY_A).returncode == 0
    assert run_key_step(step, tmp_path, KEY_A, "check").returncode == 0
    assert oct((tmp_path / dest).stat().st_mode & 0o777) == "0o644"
