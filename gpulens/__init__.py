"""gpulens: monitoring and observability for NVIDIA GPU clusters."""

# The one place the release is named: pyproject.toml reads it (dynamic version), `gpulens --version` prints it, and
# CHANGELOG.md has a section for it. No git tag is needed to know it.
__version__ = "0.2.0"
