"""llmsla.dashboards: Grafana dashboards as code (grafana-foundation-sdk), every query defined
once and proven on real backends, and ``llmsla report`` (the key panels as one HTML file).

See docs/dashboards.md. This package imports core modules only (names, config, store)."""
