"""`gpuk8s kubeconfig` helpers: where --merge writes, and the context renamed in a file of its own."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from gpuk8s.commands.kubeconfig import merge_destination, renamed
from tests.unit.test_kubeconfig_merge import admin


def test_merge_destination_is_kubeconfigs_first_file_else_home() -> None:
    assert merge_destination({"KUBECONFIG": os.pathsep.join(["", "/a/one", "/b/two"])}) == Path("/a/one")
    assert merge_destination({}) == Path.home() / ".kube" / "config"
    assert merge_destination({"KUBECONFIG": ""}) == Path.home() / ".kube" / "config"


def test_renamed_changes_only_the_context_name() -> None:
    text = admin()
    cfg, new = yaml.safe_load(text), yaml.safe_load(renamed(text, "gpu-prod"))
    assert new["current-context"] == "gpu-prod" and new["contexts"][0]["name"] == "gpu-prod"
    assert new["contexts"][0]["context"] == cfg["contexts"][0]["context"]
    assert new["users"] == cfg["users"] and new["clusters"] == cfg["clusters"]
