-- TimescaleDB: a hypertable with daily chunks and the columnstore, like gpu_windows; retention
-- and columnstore policies are applied from configuration by llmsla.store.maintenance.
SELECT create_hypertable('engine_windows', by_range('bucket', INTERVAL '1 day'), if_not_exists => TRUE);

ALTER TABLE engine_windows SET (
    timescaledb.enable_columnstore = true,
    timescaledb.segmentby = 'pool, replica, engine',
    timescaledb.orderby = 'bucket DESC'
);
