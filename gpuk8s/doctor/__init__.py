"""gpuk8s doctor: why a GPU pod is Pending or failing, and why a GPU node lacks its GPUs.

`evidence` holds what doctor reads (the cluster's objects, events and logs through the kube client seam; one SSH
round trip per node for the host's side) as plain data; `classify` maps that evidence to causes, each a finding
with a registered id (gpuk8s/findings.py), the evidence lines and a remedy, most likely first. Pure: no I/O.
"""
