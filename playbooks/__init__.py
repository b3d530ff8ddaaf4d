"""gpuk8s playbooks: the YAML files next to this one, shipped in the package as gpuk8s.playbooks."""
