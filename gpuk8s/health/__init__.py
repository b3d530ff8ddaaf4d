"""GPU health (`gpuk8s health`, docs/health.md): NVIDIA's Xid catalogue (xid), the quick level's checks (checks, pure),
and the run over SSH (run)."""
