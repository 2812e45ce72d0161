-- TimescaleDB: continuous aggregates over the forecasts hypertable; their refresh policies are
-- applied from configuration by llmsla.store.maintenance.
{{FORECAST_ROLLUP_CAGGS}}
