-- TimescaleDB: continuous aggregates over the engine_windows hypertable; their refresh and
-- retention policies are applied from configuration by llmsla.store.maintenance.
{{ENGINE_ROLLUP_CAGGS}}
