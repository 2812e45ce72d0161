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

-- TimescaleDB: continuous aggregates over the engine_windows hypertable; their refresh and
-- retention policies are applied from configuration by llmsla.store.maintenance.
CREATE MATERIALIZED VIEW IF NOT EXISTS engine_windows_1m
WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS
SELECT time_bucket(INTERVAL '1 minute', bucket) AS bucket, pool, replica, engine, count(*) AS windows, sum(samples) AS samples, sum(waiting_mean * samples) / NULLIF(sum(CASE WHEN waiting_mean IS NOT NULL THEN samples END), 0) AS waiting_mean, max(waiting_max) AS waiting_max, sum(running_mean * samples) / NULLIF(sum(CASE WHEN running_mean IS NOT NULL THEN samples END), 0) AS running_mean, max(running_max) AS running_max, sum(kv_usage_mean * samples) / NULLIF(sum(CASE WHEN kv_usage_mean IS NOT NULL THEN samples END), 0) AS kv_usage_mean, max(kv_usage_max) AS kv_usage_max, sum(preemptions) AS preemptions, sum(prefix_cache_hit_rate_mean * samples) / NULLIF(sum(CASE WHEN prefix_cache_hit_rate_mean IS NOT NULL THEN samples END), 0) AS prefix_cache_hit_rate_mean, sum(engine_ttft_count) AS engine_ttft_count, sum(engine_ttft_sum_ms) AS engine_ttft_sum_ms, sum(engine_ttft_sum_ms) / NULLIF(sum(engine_ttft_count), 0) AS engine_ttft_mean_ms, sum(counter_resets) AS counter_resets, llmsla_hist_sum(engine_ttft_hist) AS engine_ttft_hist
FROM engine_windows
GROUP BY time_bucket(INTERVAL '1 minute', bucket), pool, replica, engine
WITH NO DATA;

CREATE MATERIALIZED VIEW IF NOT EXISTS engine_windows_1h
WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS
SELECT time_bucket(INTERVAL '1 hour', bucket) AS bucket, pool, replica, engine, count(*) AS windows, sum(samples) AS samples, sum(waiting_mean * samples) / NULLIF(sum(CASE WHEN waiting_mean IS NOT NULL THEN samples END), 0) AS waiting_mean, max(waiting_max) AS waiting_max, sum(running_mean * samples) / NULLIF(sum(CASE WHEN running_mean IS NOT NULL THEN samples END), 0) AS running_mean, max(running_max) AS running_max, sum(kv_usage_mean * samples) / NULLIF(sum(CASE WHEN kv_usage_mean IS NOT NULL THEN samples END), 0) AS kv_usage_mean, max(kv_usage_max) AS kv_usage_max, sum(preemptions) AS preemptions, sum(prefix_cache_hit_rate_mean * samples) / NULLIF(sum(CASE WHEN prefix_cache_hit_rate_mean IS NOT NULL THEN samples END), 0) AS prefix_cache_hit_rate_mean, sum(engine_ttft_count) AS engine_ttft_count, sum(engine_ttft_sum_ms) AS engine_ttft_sum_ms, sum(engine_ttft_sum_ms) / NULLIF(sum(engine_ttft_count), 0) AS engine_ttft_mean_ms, sum(counter_resets) AS counter_resets, llmsla_hist_sum(engine_ttft_hist) AS engine_ttft_hist
FROM engine_windows
GROUP BY time_bucket(INTERVAL '1 hour', bucket), pool, replica, engine
WITH NO DATA;

CALL refresh_continuous_aggregate('engine_windows_1m', NULL, NULL);

CALL refresh_continuous_aggregate('engine_windows_1h', NULL, NULL);
