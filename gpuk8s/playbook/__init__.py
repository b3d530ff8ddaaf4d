"""Playbooks: readable YAML steps, rendered per host, run as one remote script per host."""
