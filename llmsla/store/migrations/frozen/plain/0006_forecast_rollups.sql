-- Forecast roll-ups (forecasts_1m, forecasts_1h): steps, highest and summed risk, threshold and
-- steps at or above it per minute and hour, so a 7-day risk panel reads 168 rows per series
-- instead of every 5 s score. The flavour files create them (llmsla.store.forecast_rollups).

-- Plain PostgreSQL: tables backfilled from the stored forecasts and kept current by a
-- statement-level trigger on forecasts.
CREATE TABLE forecasts_1m AS
SELECT date_bin(INTERVAL '1 minute', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket, forecaster, target, pool, replica, horizon_s, count(*) AS steps, max(risk) AS risk_max, sum(risk) AS risk_sum, max(threshold) AS threshold, sum(CASE WHEN risk >= threshold THEN 1 ELSE 0 END) AS alarm_steps
FROM forecasts
GROUP BY date_bin(INTERVAL '1 minute', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00'), forecaster, target, pool, replica, horizon_s
WITH NO DATA;

ALTER TABLE forecasts_1m ADD PRIMARY KEY (bucket, forecaster, target, pool, replica, horizon_s);

INSERT INTO forecasts_1m
SELECT date_bin(INTERVAL '1 minute', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket, forecaster, target, pool, replica, horizon_s, count(*) AS steps, max(risk) AS risk_max, sum(risk) AS risk_sum, max(threshold) AS threshold, sum(CASE WHEN risk >= threshold THEN 1 ELSE 0 END) AS alarm_steps
FROM forecasts
GROUP BY date_bin(INTERVAL '1 minute', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00'), forecaster, target, pool, replica, horizon_s;

CREATE TABLE forecasts_1h AS
SELECT date_bin(INTERVAL '1 hour', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket, forecaster, target, pool, replica, horizon_s, count(*) AS steps, max(risk) AS risk_max, sum(risk) AS risk_sum, max(threshold) AS threshold, sum(CASE WHEN risk >= threshold THEN 1 ELSE 0 END) AS alarm_steps
FROM forecasts
GROUP BY date_bin(INTERVAL '1 hour', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00'), forecaster, target, pool, replica, horizon_s
WITH NO DATA;

ALTER TABLE forecasts_1h ADD PRIMARY KEY (bucket, forecaster, target, pool, replica, horizon_s);

INSERT INTO forecasts_1h
SELECT date_bin(INTERVAL '1 hour', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket, forecaster, target, pool, replica, horizon_s, count(*) AS steps, max(risk) AS risk_max, sum(risk) AS risk_sum, max(threshold) AS threshold, sum(CASE WHEN risk >= threshold THEN 1 ELSE 0 END) AS alarm_steps
FROM forecasts
GROUP BY date_bin(INTERVAL '1 hour', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00'), forecaster, target, pool, replica, horizon_s;

CREATE OR REPLACE FUNCTION llmsla_forecast_rollups() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(296026385);
    WITH g AS (SELECT DISTINCT date_bin(INTERVAL '1 minute', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, forecaster, target, pool, replica, horizon_s FROM llmsla_new_rows)
    INSERT INTO forecasts_1m (bucket, forecaster, target, pool, replica, horizon_s, steps, risk_max, risk_sum, threshold, alarm_steps)
    SELECT g.b, g.forecaster, g.target, g.pool, g.replica, g.horizon_s, count(*) AS steps, max(risk) AS risk_max, sum(risk) AS risk_sum, max(threshold) AS threshold, sum(CASE WHEN risk >= threshold THEN 1 ELSE 0 END) AS alarm_steps
    FROM forecasts s JOIN g ON g.b = date_bin(INTERVAL '1 minute', s.ts, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND s.forecaster = g.forecaster AND s.target = g.target AND s.pool = g.pool AND s.replica = g.replica AND s.horizon_s = g.horizon_s
    WHERE s.ts >= (SELECT min(b) FROM g) AND s.ts < (SELECT max(b) FROM g) + INTERVAL '1 minute'
    GROUP BY g.b, g.forecaster, g.target, g.pool, g.replica, g.horizon_s
    ON CONFLICT (bucket, forecaster, target, pool, replica, horizon_s) DO UPDATE SET steps = EXCLUDED.steps, risk_max = EXCLUDED.risk_max, risk_sum = EXCLUDED.risk_sum, threshold = EXCLUDED.threshold, alarm_steps = EXCLUDED.alarm_steps;
    WITH g AS (SELECT DISTINCT date_bin(INTERVAL '1 hour', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, forecaster, target, pool, replica, horizon_s FROM llmsla_new_rows)
    INSERT INTO forecasts_1h (bucket, forecaster, target, pool, replica, horizon_s, steps, risk_max, risk_sum, threshold, alarm_steps)
    SELECT g.b, g.forecaster, g.target, g.pool, g.replica, g.horizon_s, sum(steps) AS steps, max(risk_max) AS risk_max, sum(risk_sum) AS risk_sum, max(threshold) AS threshold, sum(alarm_steps) AS alarm_steps
    FROM forecasts_1m s JOIN g ON g.b = date_bin(INTERVAL '1 hour', s.bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND s.forecaster = g.forecaster AND s.target = g.target AND s.pool = g.pool AND s.replica = g.replica AND s.horizon_s = g.horizon_s
    WHERE s.bucket >= (SELECT min(b) FROM g) AND s.bucket < (SELECT max(b) FROM g) + INTERVAL '1 hour'
    GROUP BY g.b, g.forecaster, g.target, g.pool, g.replica, g.horizon_s
    ON CONFLICT (bucket, forecaster, target, pool, replica, horizon_s) DO UPDATE SET steps = EXCLUDED.steps, risk_max = EXCLUDED.risk_max, risk_sum = EXCLUDED.risk_sum, threshold = EXCLUDED.threshold, alarm_steps = EXCLUDED.alarm_steps;
    RETURN NULL;
END $$;

CREATE TRIGGER forecasts_rollup_insert AFTER INSERT ON forecasts
REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION llmsla_forecast_rollups();

CREATE TRIGGER forecasts_rollup_update AFTER UPDATE ON forecasts
REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION llmsla_forecast_rollups();
