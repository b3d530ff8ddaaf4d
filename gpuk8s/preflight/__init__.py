"""Preflight: is every host, and the cluster as a whole, ready for gpuk8s install?"""
