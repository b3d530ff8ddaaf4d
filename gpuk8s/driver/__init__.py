"""The NVIDIA driver: which branch and kernel modules a node gets (rules), from the inventory and the host's facts."""
