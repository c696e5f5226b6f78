"""The per-node agent: sources, job mapping and the HTTP endpoints."""
