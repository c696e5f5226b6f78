"""gpulens: monitoring and observability for NVIDIA GPU clusters."""

__version__ = "0.1.0"
