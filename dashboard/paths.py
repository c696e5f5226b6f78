"""The dashboard's page paths, built in one place (pure; figures put them in customdata for click-through)."""

from __future__ import annotations

from urllib.parse import quote


def node_path(node: str) -> str:
    return f"/nodes/{quote(node, safe='')}"


def gpu_path(uuid: str) -> str:
    return f"/gpus/{quote(uuid, safe='')}"


def job_path(job_id: str) -> str:
    return f"/jobs/{quote(job_id, safe='')}"
