"""The one base of every error gpuk8s raises for a person to read, and the errors several modules share.

A GpuK8sError carries `message` (safe to show: masked, without control characters, since it may quote a host, a
cluster object or a user's file), `remedy` (what to do) and `kind` (stable, for scripts and -o json). Code that
runs a step and reports what failed catches GpuK8sError, not a list of classes. Each module keeps its own
subclass where callers tell them apart (RemoteError, KubeError, PhaseError, InventoryError, ...);
tests/unit/test_layers.py checks that every public exception class derives from this base and that no two share
a name.
"""

from __future__ import annotations

from gpuk8s.logs import mask
from gpuk8s.text import clean


class GpuK8sError(Exception):
    """An error for a person: message, remedy and a stable kind."""

    kind = "error"

    def __init__(self, message: str = "", remedy: str = "", kind: str | None = None) -> None:
        message = mask(clean(message))
        super().__init__(message)
        self.message = message
        self.remedy = mask(clean(remedy))
        if kind is not None:
            self.kind = kind


class ParseError(GpuK8sError, ValueError):
    """A tool's output (the probe's sections, nvidia-smi's MIG listings) that cannot be understood."""

    kind = "parse"


class CredentialError(GpuK8sError):
    """A secret (a sudo password, the registry mirror's credentials) cannot be read; the message says where it was
    looked for, never a value."""

    kind = "credentials"


class MetricsError(GpuK8sError, ValueError):
    """A DCGM exporter's /metrics body is not the Prometheus text format, or is larger than gpuk8s reads."""

    kind = "metrics"
