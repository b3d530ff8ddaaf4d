"""gpuk8s install: preflight, then every node prepared from the playbooks, one script per host."""
