"""No parser of external text can be frozen (issue 28, items 3 to 6 and 8).

The text gpuk8s reads but did not write: an Ansible inventory to import, a control plane's kube-apiserver
manifest, the DCGM exporter's /metrics (from a pod on a node that may be compromised), a scheduler event's
message (anyone who may create Events in the namespace writes it), an existing ~/.kube/config. Each input below
froze or crashed gpuk8s before its fix (the time it took then is in its comment, measured on main 1ec1a96);
each must now be read in < 0.1 s of CPU, with the problem reported as a note, a finding or an error naming
the file and line, never an uncaught exception. The hostile host outputs of tests/unit/test_parsers_hostile.py
hold the same bound.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from time import process_time
from typing import Any, TypeVar

import pytest
import yaml

from gpuk8s.doctor import classify
from gpuk8s.inventory import kubespray
from gpuk8s.inventory.kubespray import convert, parse
from gpuk8s.inventory.loader import loads
from gpuk8s.kube import allocation as al
from gpuk8s.localfiles import LocalFileError, admin_kubeconfig, merge_kubeconfig
from gpuk8s.phases import monitoring_verify as mv
from gpuk8s.phases import upgrade as up

BOUND = 0.1  # seconds, as the other hostile-input suites
# Reading what a file's bounds let through (5000 hosts, 20000 host-in-group entries) and mapping it is linear
# work per entry (about 0.05 s for 20000 entries, 0.1 s to map 4000 hosts): it gets this bound, and no hostile
# shape makes it more.
AT_BOUNDS = 1.0
M = 1 << 20
FIX = Path(__file__).resolve().parents[1] / "fixtures"
T = TypeVar("T")


def fast(fn: Callable[..., T], *args: Any, bound: float = BOUND) -> T:
    """fn(*args), asserted to return (or raise) within `bound` seconds of CPU time: a parser that freezes burns
    CPU, and a machine shared with other test runs (load 15 on 2 CPUs) stretches wall time, not this."""
    t0 = process_time()
    try:
        return fn(*args)
    finally:
        elapsed = process_time() - t0
        assert elapsed < bound, f"{getattr(fn, '__name__', fn)} took {elapsed:.3f} s of CPU"


def bomb(levels: int = 9, indent: str = "") -> list[str]:
    """A 'billion laughs' of YAML lines: &a{N} is a list of nine *a{N-1}, 9**levels strings in all."""
    out = [f"{indent}a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    out += [f"{indent}a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return out


def imported(text: str, filename: str, parse_bound: float = BOUND) -> kubespray.Result:
    """The import of `text`: its parse within `parse_bound`, its mapping within AT_BOUNDS."""
    return fast(convert, fast(parse, text, filename, bound=parse_bound), filename, bound=AT_BOUNDS)


@pytest.fixture(autouse=True)
def _warm() -> None:
    """Import-time work (yaml's C parser, prometheus-client) outside the timed parts."""
    convert(parse("[kube_control_plane]\ncp1\n", "x.ini"))
    yaml.safe_load("a: 1")
    al.gpu_metrics("")


# -- 3. inventory import ----------------------------------------------------------------------------------


def test_host_ranges_are_bounded_per_file_not_per_pattern() -> None:
    # 1.9 KB: 150 patterns of 4096 hosts each, every one under the per-pattern bound (before: > 60 s, killed)
    text = "[kube_control_plane]\ncp1\n[kube_node]\n" + "".join(f"n{i}[0:4095]\n" for i in range(150))
    assert len(text) < 2048
    res = imported(text, "x.ini", AT_BOUNDS)  # 4096 hosts are mapped (0.07-0.13 s here): at the bound, not over
    assert len(res.hosts) == 1 + 4096
    [note] = [n for n in res.notes if "hosts in the file" in n.message]
    assert note.line == 5 and note.key == "n1[0:4095]" and f"more than {kubespray._MAX_HOSTS}" in note.message


def test_one_range_repeated_is_bounded_by_the_host_in_group_entries() -> None:
    # 1.8 KB: the same 4096 hosts with a variable, 70 times (before: 2.1 s, every copy walked)
    text = "[kube_control_plane]\ncp1\n[kube_node]\n" + "n[0:4095] ansible_user=u\n" * 70
    res = imported(text, "x.ini", AT_BOUNDS)  # the 16384 entries (and variables) the bound lets through are read
    assert len(res.hosts) == 1 + 4096
    [note] = [n for n in res.notes if "host-in-group entries" in n.message]
    assert note.line == 8  # the fifth copy: 5 x 4096 entries are more than 20000


def test_a_chain_of_groups_is_bounded_and_walked_with_a_set() -> None:
    # 44 KB: 2000 groups, each the only child of the one before (before: 30.6 s, cubic)
    n = 2000
    text = "[kube_control_plane]\ncp1\n" + "".join(f"[g{i}:children]\ng{i + 1}\n" for i in range(n)) + f"[g{n}]\ncp1\n"
    res = imported(text, "x.ini")
    [note] = [x for x in res.notes if "groups in the file" in x.message]
    assert f"more than {kubespray._MAX_GROUPS} groups" in note.message
    # a chain within the bound still gives the host at its end every group above it
    text = ("[kube_control_plane]\ncp1 ansible_host=10.0.0.1\n[kube_node:children]\ng0\n"
            + "".join(f"[g{i}:children]\ng{i + 1}\n" for i in range(200)) + "[g200]\nw1 ansible_host=10.0.0.2\n")
    res = imported(text, "x.ini")
    w1 = next(h for h in res.hosts if h.name == "w1")
    assert w1.role == "worker" and {"g0", "g200", "kube_node", "all"} <= set(w1.groups)


def _dag(levels: int) -> str:
    lines = ["all:", "  children:", "    kube_control_plane:", "      hosts: {cp1: {ansible_host: 10.0.0.1}}",
             "    kube_node:", "      children:", "        a0: &a0 {hosts: {w1: {ansible_host: 10.0.0.2}}}"]
    lines += [f"        a{i}: &a{i} {{children: {{x: *a{i - 1}, y: *a{i - 1}}}}}" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_yaml_groups_made_a_dag_by_aliases_are_walked_once_per_group() -> None:
    # 1.8 KB: 40 levels, each group twice the one below (before: > 60 s, killed: 2**40 walks)
    text = _dag(40)
    assert len(text) < 2048
    res = imported(text, "hosts.yaml")
    assert {(h.name, h.role) for h in res.hosts} == {("cp1", "control-plane"), ("w1", "worker")}
    w1 = next(h for h in res.hosts if h.name == "w1")
    assert {"a0", "x", "y", "kube_node"} <= set(w1.groups)


def test_a_yaml_alias_cycle_is_walked_once() -> None:
    # the group contains itself (before: an uncaught RecursionError)
    text = ("all:\n  children:\n    kube_control_plane:\n      hosts: {cp1: {ansible_host: 10.0.0.1}}\n"
            "    kube_node:\n      children:\n"
            "        a: &a {hosts: {w1: {ansible_host: 10.0.0.2}}, children: {b: *a}}\n")
    inv = fast(parse, text, "hosts.yaml")
    assert inv.groups["a"].children == {"b": 7} and inv.groups["b"].children == {"b": 7}
    res = fast(convert, inv, "hosts.yaml")
    assert {(h.name, h.role) for h in res.hosts} == {("cp1", "control-plane"), ("w1", "worker")}


def test_a_variable_that_is_an_alias_bomb_is_never_expanded() -> None:
    # 600 bytes: ansible_user is 9**9 strings (before: > 60 s, killed, in str() of the value)
    text = "\n".join(["all:", "  vars:", *bomb(indent="    "), "    ansible_user: *a8",
                      "    unrelated: *a8", "  children:", "    kube_control_plane:",
                      "      hosts: {cp1: {ansible_host: 10.0.0.1}}"]) + "\n"
    res = imported(text, "hosts.yaml")
    got = {(n.line, n.key): n.message for n in res.notes}
    assert got[(12, "ansible_user")] == ("ansible_user (group all) is a list or mapping, not a single value: "
                                         "not imported")
    assert "no gpuk8s equivalent" in got[(13, "unrelated")]
    assert res.hosts[0].user is None and "user:" not in res.text.split("hosts:")[0].split("ssh:")[1]
    loads(res.text, "imported.yaml")


def test_a_list_where_the_address_is_drops_the_host() -> None:
    res = imported("[kube_control_plane]\ncp1 ansible_host=10.0.0.1\nw1 ansible_host=\"[1, 2]\"\n", "x.ini")
    assert [h.name for h in res.hosts] == ["cp1"]
    assert any(n.key == "w1" and "its address is a list or mapping: host not imported" in n.message
               for n in res.notes)


def test_yaml_entries_repeated_by_aliases_are_bounded() -> None:
    # 23 KB: one hosts mapping of 2000 hosts, aliased into 300 groups: 600000 entries, the walk stops at the
    # file's bounds (before: 1.1 s to parse, 14 s in all)
    hosts = ", ".join(f"h{i}: " for i in range(2000))
    text = ("all:\n  children:\n    kube_control_plane:\n      hosts: {cp1: {ansible_host: 10.0.0.1}}\n"
            f"    g0: {{hosts: &h {{{hosts}}}}}\n" + "".join(f"    g{i}: {{hosts: *h}}\n" for i in range(1, 300)))
    res = imported(text, "hosts.yaml", AT_BOUNDS)  # the 20000 entries the bound lets through are read
    assert any("host-in-group entries" in n.message for n in res.notes)
    assert any("groups in the file" in n.message for n in res.notes)


def test_most_common_is_one_count() -> None:
    # list.count per value was quadratic: 20000 distinct values took seconds
    values = [f"u{i}" for i in range(20000)] + [None, "u7"]
    assert fast(kubespray._most_common, values) == "u7"
    assert kubespray._most_common(["a", "b", "b", "a"]) == "a"  # ties: the first seen, as before
    assert kubespray._most_common([]) is None


def test_a_key_path_must_be_a_regular_file_of_key_size(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"k" * ((64 << 10) + 1))
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    paths = {"w1": "/dev/zero", "w2": str(big), "w3": str(tmp_path), "w4": str(fifo), "w5": str(key),
             "w6": str(tmp_path / "missing")}
    text = "[kube_control_plane]\ncp1 ansible_host=10.0.0.1\n[kube_node]\n" + "".join(
        f"{h} ansible_host=10.0.0.{i + 2} ansible_ssh_private_key_file={p}\n" for i, (h, p) in enumerate(paths.items()))
    res = imported(text, "x.ini")
    keys = {h.name: h.identity_file for h in res.hosts}
    assert keys["w5"] == str(key) and keys["w6"] == str(tmp_path / "missing")  # a key elsewhere: imported
    assert keys["w1"] is None and keys["w2"] is None and keys["w3"] is None and keys["w4"] is None
    why = {n.line: n.message for n in res.notes if n.key == "ansible_ssh_private_key_file"}
    assert "is not a regular file: not imported" in why[4] and "/dev/zero" in why[4]
    assert "is larger than 64 KiB: not a private key: not imported" in why[5]
    assert "is not a regular file" in why[6] and "is not a regular file" in why[7]
    assert "/dev/zero" not in res.text and str(big) not in res.text


# -- 4. upgrade: the control plane's kube-apiserver manifest ------------------------------------------------

MANIFEST = """\
apiVersion: v1
kind: Pod
metadata: {name: kube-apiserver, namespace: kube-system}
spec:
  containers:
  - command: [kube-apiserver, --advertise-address=10.0.0.1]
    image: registry.k8s.io/kube-apiserver:v1.30.2
    name: kube-apiserver
"""


class _Session:
    class host:  # noqa: N801 (Session.host is an object with a name)
        name = "cp-1"

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    def run(self, command: str, **_: object) -> Any:
        class Result:
            ok = True
            stdout = self.stdout
        return Result()


def test_the_manifest_kubeadm_writes_gives_its_version() -> None:
    assert up.manifest_version(MANIFEST) == "v1.30.2"
    assert up.apiserver_version(_Session(MANIFEST)) == "v1.30.2"  # type: ignore[arg-type]


def test_a_manifest_alias_bomb_is_refused_at_once() -> None:
    # 600 bytes: image is 9**9 strings (before: > 60 s, killed, in str(image))
    text = "\n".join(["x:", *bomb(indent="  "), "spec: {containers: [{image: *a8}]}"]) + "\n"
    with pytest.raises(up.PhaseError) as e:  # a ManifestError: the upgrade's node finding, or its phase's error
        fast(up.apiserver_version, _Session(text))
    assert isinstance(e.value, up.ManifestError)
    assert e.value.message.startswith("cp-1: /etc/kubernetes/manifests/kube-apiserver.yaml uses a YAML anchor")
    assert "(line 2)" in e.value.message and "kubeadm" in e.value.remedy


@pytest.mark.parametrize("text", ["[" * 100_000, "[" * 100 + "]" * 100, "a:\n" + "".join(
    "  " * i + f"k{i}:\n" for i in range(1, 200))], ids=["unclosed", "nested lists", "nested mappings"])
def test_deep_manifest_nesting_is_no_recursion_error(text: str) -> None:
    # "[" * 100000 raised an uncaught RecursionError after 2.2 s
    try:
        version = fast(up.apiserver_version, _Session(text))
    except up.PhaseError as e:
        assert "cp-1: /etc/kubernetes/manifests/kube-apiserver.yaml nests deeper than 64 levels" in e.message
    else:
        assert version is None


@pytest.mark.parametrize("doc", [
    [], "text", {"spec": []}, {"spec": {"containers": {}}}, {"spec": {"containers": []}},
    {"spec": {"containers": ["x"]}}, {"spec": {"containers": [{"image": ["a:v1.30.2"]}]}},
    {"spec": {"containers": [{"image": 1.30}]}}, {"spec": {"containers": [{"image": "a:" + "v1.30.2" * 100}]}},
])
def test_every_field_of_the_manifest_is_type_checked(doc: object) -> None:
    assert up.manifest_version(yaml.safe_dump(doc)) is None


def test_a_manifest_larger_than_the_bound_is_refused() -> None:
    with pytest.raises(up.ManifestError, match="is larger than 256 KiB"):
        fast(up.manifest_version, MANIFEST + "#" * up.MAX_MANIFEST)


# -- 5. the DCGM exporter's /metrics -------------------------------------------------------------------------

UTIL = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA H200",Hostname="n"} 42\n'
HOSTILE_METRICS: dict[str, str] = {
    # prometheus-client's parser is quadratic in these (before: 1 MiB stalled status 12-16 s; 430 KB of
    # labels took 3.9 s, 1 MiB of escaped backslashes and quotes 1.7 s)
    "escaped quotes": ('DCGM_FI_DEV_GPU_UTIL{a="' + '\\"' * 20000 + '"} 1\n') * 26,
    "many labels": "DCGM_FI_DEV_GPU_UTIL{" + ",".join(f'l{i}="v"' for i in range(M // 12)) + "} 1\n",
    "many labels per line": ("DCGM_FI_DEV_GPU_UTIL{" + ",".join(f'l{i}="v"' for i in range(200)) + "} 1\n") * 600,
    "backslashes": ('DCGM_FI_DEV_GPU_UTIL{a="' + "\\\\" * 1000 + '\\"' * 1000 + '"} 1\n') * 256,
    "other metrics": ('go_gc{a="' + '\\"' * 20000 + '"} 1\n') * 26,
    "comments": ("# HELP DCGM_FI_DEV_GPU_UTIL " + " \t" * 20000 + "\n") * 26,
    "newlines": "\n" * M,
    "carriage returns": "\r" * M,
    "one line": "DCGM_FI_DEV_GPU_UTIL" * (M // 20) + "\n",
    "spaces": " \t" * (M // 2) + "\n",
    "bare prefixes": "DCGM_\n" * (M // 6),
    "names mid-line": "x DCGM_FI_DEV_GPU_UTIL{\n" * (M // 24),
    "names with escapes": "DCGM_FI_DEV_GPU_UTIL{\\\n" * (M // 23),
}


@pytest.mark.parametrize("name", list(HOSTILE_METRICS))
def test_hostile_metrics_are_cut_before_parsing(name: str) -> None:
    text = HOSTILE_METRICS[name] + UTIL
    assert len(text) <= 1.1 * M
    for parse_metrics in (al.gpu_metrics, mv.device_series):
        try:
            got: list[Any] = fast(parse_metrics, text)
        except (al.MetricsError, mv.MetricsError):
            continue
        assert len(got) == 1  # the one well-formed series is still read


def test_a_body_over_the_bound_is_not_read() -> None:
    text = UTIL + "#" * (4 << 20)
    with pytest.raises(al.MetricsError, match="larger than 4 MiB"):
        fast(al.gpu_metrics, text)
    with pytest.raises(mv.MetricsError, match="larger than 4 MiB"):
        fast(mv.device_series, text)


def test_more_series_than_the_bound_are_not_read() -> None:
    text = UTIL * 1025
    with pytest.raises(al.MetricsError, match="more than 1024 series"):
        fast(al.gpu_metrics, text)


def test_only_the_bounded_lines_of_the_series_read_reach_the_parser() -> None:
    many = "DCGM_FI_DEV_GPU_UTIL{" + ",".join(f'l{i}="v"' for i in range(al.METRICS_MAX_LABELS + 1)) + "} 7\n"
    long = 'DCGM_FI_DEV_GPU_UTIL{gpu="1",x="' + "v" * al.METRICS_MAX_LINE + '"} 7\n'
    text = "# HELP DCGM_FI_DEV_GPU_UTIL x\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + many + long + UTIL + \
        'DCGM_FI_DEV_GPU_UTILX{gpu="2"} 7\nDCGM_FI_DEV_SM_CLOCK{gpu="0"} 7\n'
    assert al.dcgm_text(text, [al.UTIL]) == UTIL
    [m] = al.gpu_metrics(text)
    assert (m.gpu, m.util) == ("0", 42.0)


# -- 6. doctor: kube-scheduler's FailedScheduling message ---------------------------------------------------

# the regex of main 1ec1a96, to check that the split gives what it gave on every message it could read
_OLD_FIT = re.compile(r"0/(\d+) nodes are available: (.*?)(?:\.?\s*preemption: (.*))?$", re.S)


def _old_parse(message: str) -> classify.FitError | None:
    m = _OLD_FIT.search(message.strip())
    if not m:
        return None
    reasons: dict[str, int] = {}
    for part in re.split(r",\s+(?=\d+ )", m.group(2).strip().rstrip(".")):
        pm = re.match(r"^(\d+) (.+)$", part.strip())
        if pm:
            reason = pm.group(2).strip().rstrip(".")
            reasons[reason] = reasons.get(reason, 0) + int(pm.group(1))
    return classify.FitError(int(m.group(1)), reasons, (m.group(3) or "").strip())


HOSTILE_EVENTS: dict[str, str] = {
    # anyone who may create Events in the namespace: 160 KiB took doctor 55-71 s (here: > 60 s, killed)
    "spaces": "0/3 nodes are available: 1 x" + " " * (160 << 10) + "y",
    "spaces before preemption": "0/3 nodes are available: 1 x" + " " * (160 << 10) + ".preemptio",
    "tabs and newlines": "0/3 nodes are available: 1 x" + " \t\n" * (50 << 10) + "y",
    "commas and spaces": "0/3 nodes are available: " + ", " * (80 << 10) + "1 x",
    "digits": "0/" + "9" * (160 << 10) + " nodes are available: 1 x",  # before: an uncaught ValueError (int())
    "heads": "0/3 nodes are available: " * (7 << 10),
}


@pytest.mark.parametrize("name", list(HOSTILE_EVENTS))
def test_a_hostile_scheduler_message_is_parsed_at_once(name: str) -> None:
    fast(classify.parse_fit_error, HOSTILE_EVENTS[name])
    pod = {"metadata": {"name": "p", "namespace": "ns"}}
    event = {"involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns"}, "reason": "FailedScheduling",
             "message": HOSTILE_EVENTS[name]}
    msg = fast(classify.scheduler_message, pod, [event] * 100)
    assert len(msg) <= classify.MAX_MESSAGE + 3


EDGES = ["0/3 nodes are available: 1 x .. . preemption: 2 y", "10/3 nodes are available: 1 a, 2 b",
         "0/3 nodes are available: 12 . . preemption: }", "0/3 nodes are available: 1 a,  2 b, c, 3 d.",
         "0/6 nodes are available: 1 node(s) had untolerated taint {a: b, c: d}, 5 Insufficient cpu.",
         "x 0/0/3 nodes are available: 1 \n2 y", "0/2 nodes are available: 2 x.\n preemption: 0/2 ..."]


@pytest.mark.parametrize("message", [p.read_text() for p in sorted((FIX / "doctor").glob("scheduler-*.txt"))]
                         + EDGES, ids=lambda m: re.sub(r"\W+", "-", m)[:40])
def test_the_split_reads_what_the_regex_read(message: str) -> None:
    assert classify.parse_fit_error(message) == _old_parse(message)


# -- 8. kubeconfig --merge into an existing ~/.kube/config --------------------------------------------------

def _admin() -> str:
    return admin_kubeconfig(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kubernetes-admin@kubernetes",
        "clusters": [{"name": "kubernetes", "cluster": {"server": "https://10.0.0.1:6443",
                                                        "certificate-authority-data": "Q0E="}}],
        "contexts": [{"name": "kubernetes-admin@kubernetes",
                      "context": {"cluster": "kubernetes", "user": "kubernetes-admin"}}],
        "users": [{"name": "kubernetes-admin", "user": {"client-certificate-data": "Q0VSVA==",
                                                         "client-key-data": "S0VZ"}}]}))


def test_a_kubeconfig_with_aliases_is_refused_naming_the_file(tmp_path: Path) -> None:
    # 700 bytes: the comparison of what was loaded expanded 9**9 strings (before: 4.1 s; 9**10: 40 s)
    old = "\n".join(["apiVersion: v1", "kind: Config", "current-context: prod", "preferences:",
                     *bomb(indent="  "), "clusters:", "- name: prod", "  cluster: {server: https://p, x: *a8}",
                     "contexts:", "- name: prod", "  context: {cluster: prod, user: prod}", "users:",
                     "- name: prod", "  user: {token: t}"]) + "\n"
    path = tmp_path / "config"
    path.write_text(old)
    admin = _admin()
    with pytest.raises(LocalFileError) as e:
        fast(merge_kubeconfig, path, admin, "lab")
    assert e.value.message == (f"{path} uses a YAML anchor (&name) (line 5): gpuk8s reads only plain kubeconfigs "
                               "(kubectl writes no anchors or aliases)")
    assert path.read_text() == old and not (tmp_path / "config.gpuk8s.bak").exists()


def test_a_deep_kubeconfig_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("clusters: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(LocalFileError, match="not valid YAML|nests deeper than 64 levels"):
        fast(merge_kubeconfig, path, _admin(), "lab")


@pytest.mark.parametrize("text", ["[" * 100_000, "\n".join(["apiVersion: v1", *bomb(), "clusters: *a8"])])
def test_a_hostile_admin_conf_is_an_error(text: str) -> None:
    # "[" * 100000 raised an uncaught RecursionError
    with pytest.raises(LocalFileError, match="admin.conf"):
        fast(admin_kubeconfig, text)
