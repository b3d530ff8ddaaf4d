"""Kubernetes on the prepared nodes: kubeadm configurations, manifests, phases run over SSH."""
