"""The admin kubeconfig on the operator's machine: 0600, atomic, never through a symlink, never clobbering."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from gpuk8s import localfiles
from gpuk8s.localfiles import LocalFileError, merge_kubeconfig, write_private

KEY = "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpzZWNyZXQta2V5LW1hdGVyaWFs"


def admin_conf(server: str = "https://10.0.0.10:6443", key: str = KEY) -> str:
    """What kubeadm writes to /etc/kubernetes/admin.conf (its fixed names: kubernetes, kubernetes-admin)."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "kubernetes", "cluster": {"server": server, "certificate-authority-data": "Q0E="}}],
        "users": [{"name": "kubernetes-admin",
                   "user": {"client-certificate-data": "Q0VSVA==", "client-key-data": key}}],
        "contexts": [{"name": "kubernetes-admin@kubernetes",
                      "context": {"cluster": "kubernetes", "user": "kubernetes-admin"}}],
        "current-context": "kubernetes-admin@kubernetes",
    }, sort_keys=False)


OTHER = yaml.safe_dump({
    "apiVersion": "v1", "kind": "Config", "preferences": {},
    "clusters": [{"name": "prod", "cluster": {"server": "https://prod.example.com:6443"}}],
    "users": [{"name": "prod-user", "user": {"token": "prod-token"}}],
    "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "prod-user", "namespace": "ml"}}],
    "current-context": "prod",
}, sort_keys=False)


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p, follow_symlinks=False).st_mode)


def leftovers(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".tmp") or ".gpuk8s-" in n)


def test_new_file_is_0600_and_parent_0700(tmp_path: Path) -> None:
    dest = tmp_path / "new" / "dir" / "lab.kubeconfig"
    w = write_private(dest, admin_conf())
    assert w.status == "created" and w.changed
    assert dest.read_text() == admin_conf()
    assert mode(dest) == 0o600 and mode(dest.parent) == 0o700
    assert leftovers(dest.parent) == []


def test_different_existing_file_is_refused_without_force_and_replaced_with_it(tmp_path: Path) -> None:
    dest = tmp_path / "config"
    dest.write_text(OTHER)
    os.chmod(dest, 0o644)
    with pytest.raises(LocalFileError) as e:
        write_private(dest, admin_conf())
    assert "holds something else" in e.value.message and "--force" in e.value.remedy
    assert dest.read_text() == OTHER and mode(dest) == 0o644  # untouched
    assert KEY not in str(e.value) + e.value.remedy

    w = write_private(dest, admin_conf(), force=True)
    assert w.status == "replaced"
    assert dest.read_text() == admin_conf()
    assert mode(dest) == 0o600  # the old file's 0644 did not carry over to the key
    assert leftovers(tmp_path) == []
    assert KEY not in str(w) and KEY not in repr(w)


def test_same_content_is_a_no_op(tmp_path: Path) -> None:
    dest = tmp_path / "lab.kubeconfig"
    write_private(dest, admin_conf())
    before = os.stat(dest)
    w = write_private(dest, admin_conf())
    assert w.status == "unchanged" and not w.changed
    after = os.stat(dest)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_same_content_with_a_wide_mode_is_narrowed(tmp_path: Path) -> None:
    dest = tmp_path / "lab.kubeconfig"
    dest.write_text(admin_conf())
    os.chmod(dest, 0o644)
    assert write_private(dest, admin_conf()).status == "unchanged"
    assert mode(dest) == 0o600


@pytest.mark.parametrize("force", [False, True])
def test_symlink_is_refused_and_its_target_untouched(tmp_path: Path, force: bool) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    os.chmod(target, 0o644)
    link = tmp_path / "lab.kubeconfig"
    link.symlink_to(target)
    with pytest.raises(LocalFileError) as e:
        write_private(link, admin_conf(), force=force)
    assert "symbolic link" in e.value.message
    assert target.read_text() == "precious\n" and mode(target) == 0o644
    assert link.is_symlink()
    assert leftovers(tmp_path) == []


def test_dangling_symlink_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    link = tmp_path / "lab.kubeconfig"
    link.symlink_to(tmp_path / "not-there")
    with pytest.raises(LocalFileError):
        write_private(link, admin_conf(), force=True)
    assert not (tmp_path / "not-there").exists()


def test_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(LocalFileError) as e:
        write_private(fifo, admin_conf(), force=True)
    assert "not a regular file" in e.value.message
    with pytest.raises(LocalFileError):
        write_private(tmp_path, admin_conf(), force=True)  # a directory


def test_the_file_is_never_wider_than_0600_even_with_umask_0(tmp_path: Path, monkeypatch) -> None:
    """Every file that appears in the directory while writing is 0600: checked at the moment of the rename."""
    seen: list[tuple[str, int]] = []
    real_replace = os.replace

    def spy(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        for n in os.listdir(tmp_path):
            seen.append((n, stat.S_IMODE(os.stat(tmp_path / n).st_mode)))
        return real_replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(localfiles.os, "replace", spy)
    old = os.umask(0)
    try:
        write_private(tmp_path / "lab.kubeconfig", admin_conf())
    finally:
        os.umask(old)
    assert seen and all(m == 0o600 for _, m in seen), seen
    assert mode(tmp_path / "lab.kubeconfig") == 0o600
    assert leftovers(tmp_path) == []


def test_no_temporary_file_is_left_after_a_failure(tmp_path: Path, monkeypatch) -> None:
    dest = tmp_path / "lab.kubeconfig"
    dest.write_text(OTHER)

    def boom(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(localfiles.os, "fsync", boom)
    with pytest.raises(LocalFileError) as e:
        write_private(dest, admin_conf(), force=True)
    assert "No space left" in e.value.message and KEY not in e.value.message
    assert dest.read_text() == OTHER  # the old file is intact: nothing was truncated
    assert leftovers(tmp_path) == []


def test_merge_keeps_the_other_context_and_the_current_context(tmp_path: Path) -> None:
    cfg = tmp_path / ".kube" / "config"
    cfg.parent.mkdir()
    cfg.write_text(OTHER)
    os.chmod(cfg, 0o644)
    w = merge_kubeconfig(cfg, admin_conf(), "lab")
    assert w.status == "merged" and "lab-admin@lab" in w.message and "prod" in w.message
    assert KEY not in str(w)
    got = yaml.safe_load(cfg.read_text())
    assert got["current-context"] == "prod"
    assert {c["name"] for c in got["contexts"]} == {"prod", "lab-admin@lab"}
    assert {c["name"] for c in got["clusters"]} == {"prod", "lab"}
    assert {u["name"] for u in got["users"]} == {"prod-user", "lab-admin"}
    prod = next(c for c in got["contexts"] if c["name"] == "prod")
    assert prod["context"] == {"cluster": "prod", "user": "prod-user", "namespace": "ml"}
    lab = next(c for c in got["contexts"] if c["name"] == "lab-admin@lab")
    assert lab["context"] == {"cluster": "lab", "user": "lab-admin"}
    assert next(u for u in got["users"] if u["name"] == "lab-admin")["user"]["client-key-data"] == KEY
    assert next(c for c in got["clusters"] if c["name"] == "lab")["cluster"]["server"] == "https://10.0.0.10:6443"
    assert mode(cfg) == 0o600
    assert leftovers(cfg.parent) == []


def test_merge_again_is_unchanged_and_a_new_key_replaces_only_this_cluster(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(OTHER)
    merge_kubeconfig(cfg, admin_conf(), "lab")
    assert merge_kubeconfig(cfg, admin_conf(), "lab").status == "unchanged"
    merge_kubeconfig(cfg, admin_conf(key="bmV3LWtleQ=="), "lab")  # the cluster was re-created
    got = yaml.safe_load(cfg.read_text())
    assert [u["name"] for u in got["users"]] == ["prod-user", "lab-admin"]
    assert got["users"][1]["user"]["client-key-data"] == "bmV3LWtleQ=="
    # a second gpuk8s cluster merges beside the first: kubeadm's fixed names do not clash
    merge_kubeconfig(cfg, admin_conf(server="https://10.1.0.10:6443"), "lab2")
    got = yaml.safe_load(cfg.read_text())
    assert [c["name"] for c in got["contexts"]] == ["prod", "lab-admin@lab", "lab2-admin@lab2"]
    assert got["current-context"] == "prod"


def test_merge_into_a_missing_file_sets_the_current_context(tmp_path: Path) -> None:
    cfg = tmp_path / ".kube" / "config"
    w = merge_kubeconfig(cfg, admin_conf(), "lab")
    assert w.status == "merged"
    got = yaml.safe_load(cfg.read_text())
    assert got["current-context"] == "lab-admin@lab" and got["kind"] == "Config"
    assert mode(cfg) == 0o600


def test_merge_refuses_a_symlink_and_a_non_kubeconfig(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_text(OTHER)
    link = tmp_path / "config"
    link.symlink_to(real)
    with pytest.raises(LocalFileError):
        merge_kubeconfig(link, admin_conf(), "lab")
    assert real.read_text() == OTHER
    bad = tmp_path / "bad"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(LocalFileError) as e:
        merge_kubeconfig(bad, admin_conf(), "lab")
    assert "not a kubeconfig" in e.value.message and bad.read_text() == "- just\n- a list\n"


def test_errors_never_quote_the_content(tmp_path: Path) -> None:
    with pytest.raises(LocalFileError) as e:
        merge_kubeconfig(tmp_path / "c", "users: [{name: x, key: '" + KEY + "'\n", "lab")  # broken YAML
    assert KEY not in e.value.message + e.value.remedy
    with pytest.raises(LocalFileError) as e:
        merge_kubeconfig(tmp_path / "c", yaml.safe_dump({"users": [{"user": {"k": KEY}}]}), "lab")
    assert KEY not in e.value.message + e.value.remedy
    assert leftovers(tmp_path) == [] and not (tmp_path / "c").exists()


# -- the admin kubeconfig a control plane sends is rebuilt from kubeadm's fields only ------------------------

ADMIN = {
    "apiVersion": "v1", "kind": "Config", "current-context": "kubernetes-admin@kubernetes",
    "clusters": [{"name": "kubernetes", "cluster": {"server": "https://10.0.0.10:6443",
                                                    "certificate-authority-data": "TEFCLUNB"}}],
    "contexts": [{"name": "kubernetes-admin@kubernetes", "context": {"cluster": "kubernetes",
                                                                      "user": "kubernetes-admin"}}],
    "users": [{"name": "kubernetes-admin", "user": {"client-certificate-data": "Q0VSVA==",
                                                    "client-key-data": "S0VZU0VDUkVU"}}],
}


def test_kubeadms_admin_conf_is_taken_as_it_is() -> None:
    from gpuk8s.localfiles import admin_kubeconfig

    assert yaml.safe_load(admin_kubeconfig(yaml.safe_dump(ADMIN))) == ADMIN


@pytest.mark.parametrize("hostile", [
    {"users": [{"name": "kubernetes-admin", "user": {"exec": {"command": "sh", "args": ["-c", "touch /tmp/x"],
                                                              "apiVersion": "client.authentication.k8s.io/v1"}}}]},
    {"users": [{"name": "kubernetes-admin", "user": {"client-certificate-data": "Q0VSVA==",
                                                     "client-key-data": "S0VZ", "tokenFile": "/etc/shadow"}}]},
    {"users": [{"name": "kubernetes-admin", "user": {"auth-provider": {"name": "oidc"}}}]},
    {"clusters": [{"name": "kubernetes", "cluster": {"server": "https://x:6443", "proxy-url": "http://evil",
                                                     "certificate-authority-data": "TEFC"}}]},
    {"clusters": [{"name": "kubernetes", "cluster": {"server": "http://10.0.0.10:6443",
                                                     "certificate-authority-data": "TEFC"}}]},
    {"contexts": [{"name": "a", "context": {"cluster": "kubernetes", "user": "kubernetes-admin"}},
                  {"name": "b", "context": {"cluster": "kubernetes", "user": "kubernetes-admin"}}]},
])
def test_a_kubeconfig_that_could_run_or_read_something_here_is_refused(hostile: dict) -> None:
    from gpuk8s.localfiles import LocalFileError, admin_kubeconfig

    with pytest.raises(LocalFileError) as e:
        admin_kubeconfig(yaml.safe_dump({**ADMIN, **hostile}))
    assert "touch" not in e.value.message and "S0VZ" not in e.value.message  # never the content
