-- TimescaleDB (2.18+ APIs): hypertables with daily chunks, columnstore on the window tables,
-- continuous aggregates for the roll-ups. Retention/columnstore/refresh policies are (re)applied
-- from configuration by llmsla.store.maintenance, not here, so changing a setting needs no
-- migration.

SELECT create_hypertable('request_windows', by_range('bucket', INTERVAL '1 day'), if_not_exists => TRUE);
SELECT create_hypertable('policy_windows', by_range('bucket', INTERVAL '1 day'), if_not_exists => TRUE);
SELECT create_hypertable('gpu_windows', by_range('bucket', INTERVAL '1 day'), if_not_exists => TRUE);
SELECT create_hypertable('dead_letters', by_range('received_at', INTERVAL '1 day'), if_not_exists => TRUE);
SELECT create_hypertable('forecasts', by_range('ts', INTERVAL '1 day'), if_not_exists => TRUE);
SELECT create_hypertable('action_log', by_range('ts', INTERVAL '1 day'), if_not_exists => TRUE);
SELECT create_hypertable('ab_results', by_range('ts', INTERVAL '1 day'), if_not_exists => TRUE);

ALTER TABLE request_windows SET (
    timescaledb.enable_columnstore = true,
    timescaledb.segmentby = 'model, pool, replica, arm',
    timescaledb.orderby = 'bucket DESC'
);
ALTER TABLE policy_windows SET (
    timescaledb.enable_columnstore = true,
    timescaledb.segmentby = 'zone, policy_id',
    timescaledb.orderby = 'bucket DESC'
);
ALTER TABLE gpu_windows SET (
    timescaledb.enable_columnstore = true,
    timescaledb.segmentby = 'node, gpu',
    timescaledb.orderby = 'bucket DESC'
);

{{ROLLUP_VIEWS}}
