"""The gpuk8s lab: simulated GPU servers with real SSH on one Linux machine (see README.md)."""
