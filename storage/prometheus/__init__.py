"""A read-only store over a Prometheus-compatible query API (Prometheus, Thanos, Mimir, VictoriaMetrics).

``PromReader`` (``storage.prometheus.reader``) serves the store read interface (``gpulens.storage.reading``) from the
gpulens and dcgm-exporter series Prometheus already scrapes; ``storage.prometheus.client`` speaks the HTTP API and
``gpulens.storage.prometheus.families`` maps series to reading fields. See docs/prometheus.md.
"""

from gpulens.storage.prometheus.reader import PromReader

__all__ = ["PromReader"]
