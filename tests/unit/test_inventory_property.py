"""Property: any bytes or YAML fed to the loader give an inventory or InventoryError with a location."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuk8s.inventory import Inventory, InventoryError, loads

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
keys = st.sampled_from(["cluster", "ssh", "hosts", "name", "address", "role", "gpus", "labels", "taints",
                        "port", "user", "sudo", "mode", "kubernetes_version", "x", "password"])
trees = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(keys, c, max_size=5)),
                     max_leaves=25)


def _check(data: bytes | str) -> None:
    try:
        inv = loads(data, "fuzz.yaml")
    except InventoryError as e:
        assert e.problems and all(p.file == "fuzz.yaml" and p.line >= 0 for p in e.problems)
        return
    assert isinstance(inv, Inventory)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_any_bytes(data: bytes) -> None:
    _check(data)


# no deadline: these check what the loader answers, not how fast (a loaded machine missed hypothesis's 200 ms);
# tests/unit/test_hostile_text.py bounds the loader's CPU time on hostile input
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(trees)
def test_any_yaml_document(tree: object) -> None:
    _check(yaml.safe_dump(tree))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, trees, max_size=4))
def test_any_top_level_mapping(doc: dict) -> None:
    _check(yaml.safe_dump(doc))


def test_deep_nesting_and_aliases() -> None:
    _check("[" * 5000 + "]" * 5000)
    _check("a: &x [*x]\n")
    _check("hosts: &h\n  - *h\n")
