"""MIG (Multi-Instance GPU): the profile tables of MIG-capable GPUs, layouts and the host-side diff.

profiles.py: what each GPU model offers (NVIDIA's MIG user guide, "Supported MIG Profiles") and the driver
floors; layout.py: named layouts as nvidia-mig-parted names them, explicit lists, resolving a layout
against one GPU, the current-vs-wanted diff and the extended resources the device plugin will expose.
Everything here is pure: no SSH, no I/O.
"""
