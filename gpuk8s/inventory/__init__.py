"""The inventory: which hosts, how to reach them, and what cluster to build."""

from gpuk8s.inventory.loader import InventoryError, find_inventory, load, loads
from gpuk8s.inventory.model import Host, Inventory, Problem, SSHSettings

__all__ = ["Host", "Inventory", "InventoryError", "Problem", "SSHSettings", "find_inventory", "load", "loads"]
