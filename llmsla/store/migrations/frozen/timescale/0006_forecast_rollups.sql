-- Forecast roll-ups (forecasts_1m, forecasts_1h): steps, highest and summed risk, threshold and
-- steps at or above it per minute and hour, so a 7-day risk panel reads 168 rows per series
-- instead of every 5 s score. The flavour files create them (llmsla.store.forecast_rollups).

-- TimescaleDB: continuous aggregates over the forecasts hypertable; their refresh policies are
-- applied from configuration by llmsla.store.maintenance.
CREATE MATERIALIZED VIEW IF NOT EXISTS forecasts_1m
WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS
SELECT time_bucket(INTERVAL '1 minute', ts) AS bucket, forecaster, target, pool, replica, horizon_s, count(*) AS steps, max(risk) AS risk_max, sum(risk) AS risk_sum, max(threshold) AS threshold, sum(CASE WHEN risk >= threshold THEN 1 ELSE 0 END) AS alarm_steps
FROM forecasts
GROUP BY time_bucket(INTERVAL '1 minute', ts), forecaster, target, pool, replica, horizon_s
WITH NO DATA;

CREATE MATERIALIZED VIEW IF NOT EXISTS forecasts_1h
WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS
SELECT time_bucket(INTERVAL '1 hour', ts) AS bucket, forecaster, target, pool, replica, horizon_s, count(*) AS steps, max(risk) AS risk_max, sum(risk) AS risk_sum, max(threshold) AS threshold, sum(CASE WHEN risk >= threshold THEN 1 ELSE 0 END) AS alarm_steps
FROM forecasts
GROUP BY time_bucket(INTERVAL '1 hour', ts), forecaster, target, pool, replica, horizon_s
WITH NO DATA;

CALL refresh_continuous_aggregate('forecasts_1m', NULL, NULL);

CALL refresh_continuous_aggregate('forecasts_1h', NULL, NULL);
