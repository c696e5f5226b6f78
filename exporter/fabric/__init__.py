"""The node agent's fabric and host readers: RDMA ports, NIC-to-GPU affinity, host and per-job CPU and memory.

Self-contained readers over injected roots (``root`` for sysfs, ``proc_root``, ``cgroup_root``), producing the
records of ``gpulens.fabricmodel``. See docs/fabric.md.
"""
