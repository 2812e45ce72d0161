-- The request windows and their 1 m / 1 h roll-ups gain the request's tenant and class as key
-- columns (the rows written before read as the default tenant and class) and a goodput count:
-- ok requests within every latency objective of the SLO catalog at once (llmsla.goodput; NULL in
-- the windows written before, where it is not known). Sums over tenants and classes give the
-- fleet's figures as before. See docs/store.md.

-- TimescaleDB: the hypertable back to the rowstore for its new key and segmentby, the
-- continuous aggregates created anew.
ALTER MATERIALIZED VIEW request_windows_1m RENAME TO request_windows_1m_pre0013;

SELECT remove_continuous_aggregate_policy('request_windows_1m_pre0013', if_exists => true);

ALTER MATERIALIZED VIEW request_windows_1h RENAME TO request_windows_1h_pre0013;

SELECT remove_continuous_aggregate_policy('request_windows_1h_pre0013', if_exists => true);

CALL remove_columnstore_policy('request_windows', if_exists => true);

SELECT decompress_chunk(c, if_compressed => true) FROM show_chunks('request_windows') c;

ALTER TABLE request_windows SET (timescaledb.enable_columnstore = false);

ALTER TABLE request_windows ADD COLUMN tenant text NOT NULL DEFAULT 'default', ADD COLUMN class text NOT NULL DEFAULT 'interactive', ADD COLUMN goodput bigint;

ALTER TABLE request_windows DROP CONSTRAINT request_windows_pkey, ADD PRIMARY KEY (bucket, model, pool, replica, arm, tenant, class);

ALTER TABLE request_windows SET (timescaledb.enable_columnstore = true, timescaledb.segmentby = 'model, pool, replica, arm, tenant, class', timescaledb.orderby = 'bucket DESC');

CREATE MATERIALIZED VIEW IF NOT EXISTS request_windows_1m
WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS
SELECT time_bucket(INTERVAL '1 minute', bucket) AS bucket,
       model,
       pool,
       replica,
       arm,
       count(*) AS windows,
       sum(requests) AS requests,
       sum(ok) AS ok,
       sum(errors) AS errors,
       sum(timeouts) AS timeouts,
       sum(cancelled) AS cancelled,
       sum(rejected) AS rejected,
       sum(prompt_tokens) AS prompt_tokens,
       sum(output_tokens) AS output_tokens,
       sum(ttft_within_slo) AS ttft_within_slo,
       sum(e2e_within_slo) AS e2e_within_slo,
       sum(ttft_count) AS ttft_count,
       sum(ttft_sum_ms) AS ttft_sum_ms,
       sum(e2e_sum_ms) AS e2e_sum_ms,
       sum(itl_n) AS itl_n,
       sum(itl_sum_ms) AS itl_sum_ms,
       sum(itl_sumsq_ms2) AS itl_sumsq_ms2,
       max(ttft_p99_ms) AS ttft_p99_ms_max,
       max(e2e_p99_ms) AS e2e_p99_ms_max,
       max(queue_p99_ms) AS queue_p99_ms_max,
       max(ttft_slo_ms) AS ttft_slo_ms,
       max(e2e_slo_ms) AS e2e_slo_ms,
       llmsla_hist_sum(ttft_hist) AS ttft_hist,
       llmsla_hist_sum(e2e_hist) AS e2e_hist,
       llmsla_hist_p50(ttft_hist) AS ttft_p50_ms,
       llmsla_hist_p95(ttft_hist) AS ttft_p95_ms,
       llmsla_hist_p99(ttft_hist) AS ttft_p99_ms,
       llmsla_hist_p50(e2e_hist) AS e2e_p50_ms,
       llmsla_hist_p95(e2e_hist) AS e2e_p95_ms,
       llmsla_hist_p99(e2e_hist) AS e2e_p99_ms,
       tenant,
       class,
       sum(goodput) AS goodput
FROM request_windows
GROUP BY time_bucket(INTERVAL '1 minute', bucket), model, pool, replica, arm, tenant, class
WITH NO DATA;

CREATE MATERIALIZED VIEW IF NOT EXISTS request_windows_1h
WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS
SELECT time_bucket(INTERVAL '1 hour', bucket) AS bucket,
       model,
       pool,
       replica,
       arm,
       count(*) AS windows,
       sum(requests) AS requests,
       sum(ok) AS ok,
       sum(errors) AS errors,
       sum(timeouts) AS timeouts,
       sum(cancelled) AS cancelled,
       sum(rejected) AS rejected,
       sum(prompt_tokens) AS prompt_tokens,
       sum(output_tokens) AS output_tokens,
       sum(ttft_within_slo) AS ttft_within_slo,
       sum(e2e_within_slo) AS e2e_within_slo,
       sum(ttft_count) AS ttft_count,
       sum(ttft_sum_ms) AS ttft_sum_ms,
       sum(e2e_sum_ms) AS e2e_sum_ms,
       sum(itl_n) AS itl_n,
       sum(itl_sum_ms) AS itl_sum_ms,
       sum(itl_sumsq_ms2) AS itl_sumsq_ms2,
       max(ttft_p99_ms) AS ttft_p99_ms_max,
       max(e2e_p99_ms) AS e2e_p99_ms_max,
       max(queue_p99_ms) AS queue_p99_ms_max,
       max(ttft_slo_ms) AS ttft_slo_ms,
       max(e2e_slo_ms) AS e2e_slo_ms,
       llmsla_hist_sum(ttft_hist) AS ttft_hist,
       llmsla_hist_sum(e2e_hist) AS e2e_hist,
       llmsla_hist_p50(ttft_hist) AS ttft_p50_ms,
       llmsla_hist_p95(ttft_hist) AS ttft_p95_ms,
       llmsla_hist_p99(ttft_hist) AS ttft_p99_ms,
       llmsla_hist_p50(e2e_hist) AS e2e_p50_ms,
       llmsla_hist_p95(e2e_hist) AS e2e_p95_ms,
       llmsla_hist_p99(e2e_hist) AS e2e_p99_ms,
       tenant,
       class,
       sum(goodput) AS goodput
FROM request_windows
GROUP BY time_bucket(INTERVAL '1 hour', bucket), model, pool, replica, arm, tenant, class
WITH NO DATA;

CALL refresh_continuous_aggregate('request_windows_1m', NULL, NULL);

CALL refresh_continuous_aggregate('request_windows_1h', NULL, NULL);
