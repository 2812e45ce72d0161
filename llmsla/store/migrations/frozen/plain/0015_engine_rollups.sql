-- The engine's own TTFT histogram per 5 s window: the increases of the engine's native buckets
-- over the window's samples (reset-safe, per replica in time order), spread onto the store's one
-- fixed layout (streaming NativeHistogram.java: uniformly inside each native bucket, as
-- Prometheus' histogram_quantile interpolates), an integer array indexed by layout bucket like
-- request_windows.ttft_hist. Null where the engine has no TTFT histogram and for the windows
-- written before this migration.
ALTER TABLE engine_windows ADD COLUMN engine_ttft_hist integer[];
-- Engine roll-ups (engine_windows_1m, engine_windows_1h): per minute and hour and (pool, replica,
-- engine), the 5 s engine windows under their own column names: counter increases and counts
-- summed, gauge means weighted by samples, maxima of maxima, the engine's mean TTFT from the
-- summed sum and count, its TTFT histogram summed (llmsla.store.engine_rollups, declared in
-- llmsla.store.schema), so a 7-day engine panel reads 168 rows per replica instead of every 5 s
-- window. The flavour files create them.

-- Plain PostgreSQL: tables backfilled from the stored engine windows and kept current by a
-- statement-level trigger on engine_windows.
CREATE TABLE engine_windows_1m AS
SELECT date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket, pool, replica, engine, count(*) AS windows, sum(samples) AS samples, sum(waiting_mean * samples) / NULLIF(sum(CASE WHEN waiting_mean IS NOT NULL THEN samples END), 0) AS waiting_mean, max(waiting_max) AS waiting_max, sum(running_mean * samples) / NULLIF(sum(CASE WHEN running_mean IS NOT NULL THEN samples END), 0) AS running_mean, max(running_max) AS running_max, sum(kv_usage_mean * samples) / NULLIF(sum(CASE WHEN kv_usage_mean IS NOT NULL THEN samples END), 0) AS kv_usage_mean, max(kv_usage_max) AS kv_usage_max, sum(preemptions) AS preemptions, sum(prefix_cache_hit_rate_mean * samples) / NULLIF(sum(CASE WHEN prefix_cache_hit_rate_mean IS NOT NULL THEN samples END), 0) AS prefix_cache_hit_rate_mean, sum(engine_ttft_count) AS engine_ttft_count, sum(engine_ttft_sum_ms) AS engine_ttft_sum_ms, sum(engine_ttft_sum_ms) / NULLIF(sum(engine_ttft_count), 0) AS engine_ttft_mean_ms, sum(counter_resets) AS counter_resets, llmsla_hist_sum(engine_ttft_hist) AS engine_ttft_hist
FROM engine_windows
GROUP BY date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), pool, replica, engine
WITH NO DATA;

ALTER TABLE engine_windows_1m ADD PRIMARY KEY (bucket, pool, replica, engine);

CREATE TABLE engine_windows_1h AS
SELECT date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket, pool, replica, engine, count(*) AS windows, sum(samples) AS samples, sum(waiting_mean * samples) / NULLIF(sum(CASE WHEN waiting_mean IS NOT NULL THEN samples END), 0) AS waiting_mean, max(waiting_max) AS waiting_max, sum(running_mean * samples) / NULLIF(sum(CASE WHEN running_mean IS NOT NULL THEN samples END), 0) AS running_mean, max(running_max) AS running_max, sum(kv_usage_mean * samples) / NULLIF(sum(CASE WHEN kv_usage_mean IS NOT NULL THEN samples END), 0) AS kv_usage_mean, max(kv_usage_max) AS kv_usage_max, sum(preemptions) AS preemptions, sum(prefix_cache_hit_rate_mean * samples) / NULLIF(sum(CASE WHEN prefix_cache_hit_rate_mean IS NOT NULL THEN samples END), 0) AS prefix_cache_hit_rate_mean, sum(engine_ttft_count) AS engine_ttft_count, sum(engine_ttft_sum_ms) AS engine_ttft_sum_ms, sum(engine_ttft_sum_ms) / NULLIF(sum(engine_ttft_count), 0) AS engine_ttft_mean_ms, sum(counter_resets) AS counter_resets, llmsla_hist_sum(engine_ttft_hist) AS engine_ttft_hist
FROM engine_windows
GROUP BY date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), pool, replica, engine
WITH NO DATA;

ALTER TABLE engine_windows_1h ADD PRIMARY KEY (bucket, pool, replica, engine);

INSERT INTO engine_windows_1m
SELECT date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket, pool, replica, engine, count(*) AS windows, sum(samples) AS samples, sum(waiting_mean * samples) / NULLIF(sum(CASE WHEN waiting_mean IS NOT NULL THEN samples END), 0) AS waiting_mean, max(waiting_max) AS waiting_max, sum(running_mean * samples) / NULLIF(sum(CASE WHEN running_mean IS NOT NULL THEN samples END), 0) AS running_mean, max(running_max) AS running_max, sum(kv_usage_mean * samples) / NULLIF(sum(CASE WHEN kv_usage_mean IS NOT NULL THEN samples END), 0) AS kv_usage_mean, max(kv_usage_max) AS kv_usage_max, sum(preemptions) AS preemptions, sum(prefix_cache_hit_rate_mean * samples) / NULLIF(sum(CASE WHEN prefix_cache_hit_rate_mean IS NOT NULL THEN samples END), 0) AS prefix_cache_hit_rate_mean, sum(engine_ttft_count) AS engine_ttft_count, sum(engine_ttft_sum_ms) AS engine_ttft_sum_ms, sum(engine_ttft_sum_ms) / NULLIF(sum(engine_ttft_count), 0) AS engine_ttft_mean_ms, sum(counter_resets) AS counter_resets, llmsla_hist_sum(engine_ttft_hist) AS engine_ttft_hist
FROM engine_windows
GROUP BY date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), pool, replica, engine;

INSERT INTO engine_windows_1h
SELECT date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket, pool, replica, engine, count(*) AS windows, sum(samples) AS samples, sum(waiting_mean * samples) / NULLIF(sum(CASE WHEN waiting_mean IS NOT NULL THEN samples END), 0) AS waiting_mean, max(waiting_max) AS waiting_max, sum(running_mean * samples) / NULLIF(sum(CASE WHEN running_mean IS NOT NULL THEN samples END), 0) AS running_mean, max(running_max) AS running_max, sum(kv_usage_mean * samples) / NULLIF(sum(CASE WHEN kv_usage_mean IS NOT NULL THEN samples END), 0) AS kv_usage_mean, max(kv_usage_max) AS kv_usage_max, sum(preemptions) AS preemptions, sum(prefix_cache_hit_rate_mean * samples) / NULLIF(sum(CASE WHEN prefix_cache_hit_rate_mean IS NOT NULL THEN samples END), 0) AS prefix_cache_hit_rate_mean, sum(engine_ttft_count) AS engine_ttft_count, sum(engine_ttft_sum_ms) AS engine_ttft_sum_ms, sum(engine_ttft_sum_ms) / NULLIF(sum(engine_ttft_count), 0) AS engine_ttft_mean_ms, sum(counter_resets) AS counter_resets, llmsla_hist_sum(engine_ttft_hist) AS engine_ttft_hist
FROM engine_windows
GROUP BY date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), pool, replica, engine;

CREATE OR REPLACE FUNCTION llmsla_engine_rollups() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(296026386);
    WITH g AS (SELECT DISTINCT date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, pool, replica, engine FROM llmsla_new_rows)
    INSERT INTO engine_windows_1m (bucket, pool, replica, engine, windows, samples, waiting_mean, waiting_max, running_mean, running_max, kv_usage_mean, kv_usage_max, preemptions, prefix_cache_hit_rate_mean, engine_ttft_count, engine_ttft_sum_ms, engine_ttft_mean_ms, counter_resets, engine_ttft_hist)
    SELECT g.b, g.pool, g.replica, g.engine, count(*) AS windows, sum(samples) AS samples, sum(waiting_mean * samples) / NULLIF(sum(CASE WHEN waiting_mean IS NOT NULL THEN samples END), 0) AS waiting_mean, max(waiting_max) AS waiting_max, sum(running_mean * samples) / NULLIF(sum(CASE WHEN running_mean IS NOT NULL THEN samples END), 0) AS running_mean, max(running_max) AS running_max, sum(kv_usage_mean * samples) / NULLIF(sum(CASE WHEN kv_usage_mean IS NOT NULL THEN samples END), 0) AS kv_usage_mean, max(kv_usage_max) AS kv_usage_max, sum(preemptions) AS preemptions, sum(prefix_cache_hit_rate_mean * samples) / NULLIF(sum(CASE WHEN prefix_cache_hit_rate_mean IS NOT NULL THEN samples END), 0) AS prefix_cache_hit_rate_mean, sum(engine_ttft_count) AS engine_ttft_count, sum(engine_ttft_sum_ms) AS engine_ttft_sum_ms, sum(engine_ttft_sum_ms) / NULLIF(sum(engine_ttft_count), 0) AS engine_ttft_mean_ms, sum(counter_resets) AS counter_resets, llmsla_hist_sum(engine_ttft_hist) AS engine_ttft_hist
    FROM engine_windows s JOIN g ON g.b = date_bin(INTERVAL '1 minute', s.bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND s.pool = g.pool AND s.replica = g.replica AND s.engine = g.engine
    WHERE s.bucket >= (SELECT min(b) FROM g) AND s.bucket < (SELECT max(b) FROM g) + INTERVAL '1 minute'
    GROUP BY g.b, g.pool, g.replica, g.engine
    ON CONFLICT (bucket, pool, replica, engine) DO UPDATE SET windows = EXCLUDED.windows, samples = EXCLUDED.samples, waiting_mean = EXCLUDED.waiting_mean, waiting_max = EXCLUDED.waiting_max, running_mean = EXCLUDED.running_mean, running_max = EXCLUDED.running_max, kv_usage_mean = EXCLUDED.kv_usage_mean, kv_usage_max = EXCLUDED.kv_usage_max, preemptions = EXCLUDED.preemptions, prefix_cache_hit_rate_mean = EXCLUDED.prefix_cache_hit_rate_mean, engine_ttft_count = EXCLUDED.engine_ttft_count, engine_ttft_sum_ms = EXCLUDED.engine_ttft_sum_ms, engine_ttft_mean_ms = EXCLUDED.engine_ttft_mean_ms, counter_resets = EXCLUDED.counter_resets, engine_ttft_hist = EXCLUDED.engine_ttft_hist;
    WITH g AS (SELECT DISTINCT date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, pool, replica, engine FROM llmsla_new_rows)
    INSERT INTO engine_windows_1h (bucket, pool, replica, engine, windows, samples, waiting_mean, waiting_max, running_mean, running_max, kv_usage_mean, kv_usage_max, preemptions, prefix_cache_hit_rate_mean, engine_ttft_count, engine_ttft_sum_ms, engine_ttft_mean_ms, counter_resets, engine_ttft_hist)
    SELECT g.b, g.pool, g.replica, g.engine, sum(windows) AS windows, sum(samples) AS samples, sum(waiting_mean * samples) / NULLIF(sum(CASE WHEN waiting_mean IS NOT NULL THEN samples END), 0) AS waiting_mean, max(waiting_max) AS waiting_max, sum(running_mean * samples) / NULLIF(sum(CASE WHEN running_mean IS NOT NULL THEN samples END), 0) AS running_mean, max(running_max) AS running_max, sum(kv_usage_mean * samples) / NULLIF(sum(CASE WHEN kv_usage_mean IS NOT NULL THEN samples END), 0) AS kv_usage_mean, max(kv_usage_max) AS kv_usage_max, sum(preemptions) AS preemptions, sum(prefix_cache_hit_rate_mean * samples) / NULLIF(sum(CASE WHEN prefix_cache_hit_rate_mean IS NOT NULL THEN samples END), 0) AS prefix_cache_hit_rate_mean, sum(engine_ttft_count) AS engine_ttft_count, sum(engine_ttft_sum_ms) AS engine_ttft_sum_ms, sum(engine_ttft_sum_ms) / NULLIF(sum(engine_ttft_count), 0) AS engine_ttft_mean_ms, sum(counter_resets) AS counter_resets, llmsla_hist_sum(engine_ttft_hist) AS engine_ttft_hist
    FROM engine_windows_1m s JOIN g ON g.b = date_bin(INTERVAL '1 hour', s.bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND s.pool = g.pool AND s.replica = g.replica AND s.engine = g.engine
    WHERE s.bucket >= (SELECT min(b) FROM g) AND s.bucket < (SELECT max(b) FROM g) + INTERVAL '1 hour'
    GROUP BY g.b, g.pool, g.replica, g.engine
    ON CONFLICT (bucket, pool, replica, engine) DO UPDATE SET windows = EXCLUDED.windows, samples = EXCLUDED.samples, waiting_mean = EXCLUDED.waiting_mean, waiting_max = EXCLUDED.waiting_max, running_mean = EXCLUDED.running_mean, running_max = EXCLUDED.running_max, kv_usage_mean = EXCLUDED.kv_usage_mean, kv_usage_max = EXCLUDED.kv_usage_max, preemptions = EXCLUDED.preemptions, prefix_cache_hit_rate_mean = EXCLUDED.prefix_cache_hit_rate_mean, engine_ttft_count = EXCLUDED.engine_ttft_count, engine_ttft_sum_ms = EXCLUDED.engine_ttft_sum_ms, engine_ttft_mean_ms = EXCLUDED.engine_ttft_mean_ms, counter_resets = EXCLUDED.counter_resets, engine_ttft_hist = EXCLUDED.engine_ttft_hist;
    RETURN NULL;
END $$;

CREATE TRIGGER engine_windows_rollup_insert AFTER INSERT ON engine_windows
REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION llmsla_engine_rollups();

CREATE TRIGGER engine_windows_rollup_update AFTER UPDATE ON engine_windows
REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION llmsla_engine_rollups();
