"""gpuk8s: bare NVIDIA GPU servers to one working Kubernetes cluster."""

__version__ = "0.1.0"
