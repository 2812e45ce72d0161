-- The request roll-ups become materialised on plain PostgreSQL (0003_rollup_tables.plain.sql);
-- TimescaleDB's continuous aggregates already are. Names and columns do not change.

-- Plain PostgreSQL: request_windows_1m / request_windows_1h were views over the 5 s table, so a
-- 7-day query aggregated every 5 s row and the roll-ups vanished with the 5 s partitions. They
-- become tables with the same columns, backfilled here and kept current by a statement-level
-- trigger on request_windows (llmsla.store.rollups.rollup_tables_ddl renders the SQL).

DROP VIEW IF EXISTS request_windows_1h;

DROP VIEW IF EXISTS request_windows_1m;

CREATE TABLE request_windows_1m AS
SELECT date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket,
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
       max(e2e_slo_ms) AS e2e_slo_ms
FROM request_windows
GROUP BY date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), model, pool, replica, arm
WITH NO DATA;

ALTER TABLE request_windows_1m ADD PRIMARY KEY (bucket, model, pool, replica, arm);

CREATE TABLE request_windows_1h AS
SELECT date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket,
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
       max(e2e_slo_ms) AS e2e_slo_ms
FROM request_windows
GROUP BY date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), model, pool, replica, arm
WITH NO DATA;

ALTER TABLE request_windows_1h ADD PRIMARY KEY (bucket, model, pool, replica, arm);

INSERT INTO request_windows_1m
SELECT date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket,
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
       max(e2e_slo_ms) AS e2e_slo_ms
FROM request_windows
GROUP BY date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), model, pool, replica, arm;

INSERT INTO request_windows_1h (bucket, model, pool, replica, arm, windows, requests, ok, errors, timeouts, cancelled, rejected, prompt_tokens, output_tokens, ttft_within_slo, e2e_within_slo, ttft_count, ttft_sum_ms, e2e_sum_ms, itl_n, itl_sum_ms, itl_sumsq_ms2, ttft_p99_ms_max, e2e_p99_ms_max, queue_p99_ms_max, ttft_slo_ms, e2e_slo_ms)
SELECT g.b, g.model, g.pool, g.replica, g.arm, a.*
FROM (SELECT DISTINCT date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, model, pool, replica, arm FROM request_windows_1m) g,
LATERAL (SELECT sum(windows) AS windows, sum(requests) AS requests, sum(ok) AS ok, sum(errors) AS errors, sum(timeouts) AS timeouts, sum(cancelled) AS cancelled, sum(rejected) AS rejected, sum(prompt_tokens) AS prompt_tokens, sum(output_tokens) AS output_tokens, sum(ttft_within_slo) AS ttft_within_slo, sum(e2e_within_slo) AS e2e_within_slo, sum(ttft_count) AS ttft_count, sum(ttft_sum_ms) AS ttft_sum_ms, sum(e2e_sum_ms) AS e2e_sum_ms, sum(itl_n) AS itl_n, sum(itl_sum_ms) AS itl_sum_ms, sum(itl_sumsq_ms2) AS itl_sumsq_ms2, max(ttft_p99_ms_max) AS ttft_p99_ms_max, max(e2e_p99_ms_max) AS e2e_p99_ms_max, max(queue_p99_ms_max) AS queue_p99_ms_max, max(ttft_slo_ms) AS ttft_slo_ms, max(e2e_slo_ms) AS e2e_slo_ms FROM request_windows_1m s
         WHERE s.bucket >= g.b AND s.bucket < g.b + INTERVAL '1 hour' AND s.model = g.model AND s.pool = g.pool AND s.replica = g.replica AND s.arm = g.arm) a
WHERE a.windows > 0
ON CONFLICT (bucket, model, pool, replica, arm) DO UPDATE SET windows = EXCLUDED.windows, requests = EXCLUDED.requests, ok = EXCLUDED.ok, errors = EXCLUDED.errors, timeouts = EXCLUDED.timeouts, cancelled = EXCLUDED.cancelled, rejected = EXCLUDED.rejected, prompt_tokens = EXCLUDED.prompt_tokens, output_tokens = EXCLUDED.output_tokens, ttft_within_slo = EXCLUDED.ttft_within_slo, e2e_within_slo = EXCLUDED.e2e_within_slo, ttft_count = EXCLUDED.ttft_count, ttft_sum_ms = EXCLUDED.ttft_sum_ms, e2e_sum_ms = EXCLUDED.e2e_sum_ms, itl_n = EXCLUDED.itl_n, itl_sum_ms = EXCLUDED.itl_sum_ms, itl_sumsq_ms2 = EXCLUDED.itl_sumsq_ms2, ttft_p99_ms_max = EXCLUDED.ttft_p99_ms_max, e2e_p99_ms_max = EXCLUDED.e2e_p99_ms_max, queue_p99_ms_max = EXCLUDED.queue_p99_ms_max, ttft_slo_ms = EXCLUDED.ttft_slo_ms, e2e_slo_ms = EXCLUDED.e2e_slo_ms;

CREATE OR REPLACE FUNCTION llmsla_request_rollups() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(296026384);
    INSERT INTO request_windows_1m (bucket, model, pool, replica, arm, windows, requests, ok, errors, timeouts, cancelled, rejected, prompt_tokens, output_tokens, ttft_within_slo, e2e_within_slo, ttft_count, ttft_sum_ms, e2e_sum_ms, itl_n, itl_sum_ms, itl_sumsq_ms2, ttft_p99_ms_max, e2e_p99_ms_max, queue_p99_ms_max, ttft_slo_ms, e2e_slo_ms)
    SELECT g.b, g.model, g.pool, g.replica, g.arm, a.*
    FROM (SELECT DISTINCT date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, model, pool, replica, arm FROM llmsla_new_rows) g,
    LATERAL (SELECT count(*) AS windows, sum(requests) AS requests, sum(ok) AS ok, sum(errors) AS errors, sum(timeouts) AS timeouts, sum(cancelled) AS cancelled, sum(rejected) AS rejected, sum(prompt_tokens) AS prompt_tokens, sum(output_tokens) AS output_tokens, sum(ttft_within_slo) AS ttft_within_slo, sum(e2e_within_slo) AS e2e_within_slo, sum(ttft_count) AS ttft_count, sum(ttft_sum_ms) AS ttft_sum_ms, sum(e2e_sum_ms) AS e2e_sum_ms, sum(itl_n) AS itl_n, sum(itl_sum_ms) AS itl_sum_ms, sum(itl_sumsq_ms2) AS itl_sumsq_ms2, max(ttft_p99_ms) AS ttft_p99_ms_max, max(e2e_p99_ms) AS e2e_p99_ms_max, max(queue_p99_ms) AS queue_p99_ms_max, max(ttft_slo_ms) AS ttft_slo_ms, max(e2e_slo_ms) AS e2e_slo_ms FROM request_windows s
             WHERE s.bucket >= g.b AND s.bucket < g.b + INTERVAL '1 minute' AND s.model = g.model AND s.pool = g.pool AND s.replica = g.replica AND s.arm = g.arm) a
    WHERE a.windows > 0
    ON CONFLICT (bucket, model, pool, replica, arm) DO UPDATE SET windows = EXCLUDED.windows, requests = EXCLUDED.requests, ok = EXCLUDED.ok, errors = EXCLUDED.errors, timeouts = EXCLUDED.timeouts, cancelled = EXCLUDED.cancelled, rejected = EXCLUDED.rejected, prompt_tokens = EXCLUDED.prompt_tokens, output_tokens = EXCLUDED.output_tokens, ttft_within_slo = EXCLUDED.ttft_within_slo, e2e_within_slo = EXCLUDED.e2e_within_slo, ttft_count = EXCLUDED.ttft_count, ttft_sum_ms = EXCLUDED.ttft_sum_ms, e2e_sum_ms = EXCLUDED.e2e_sum_ms, itl_n = EXCLUDED.itl_n, itl_sum_ms = EXCLUDED.itl_sum_ms, itl_sumsq_ms2 = EXCLUDED.itl_sumsq_ms2, ttft_p99_ms_max = EXCLUDED.ttft_p99_ms_max, e2e_p99_ms_max = EXCLUDED.e2e_p99_ms_max, queue_p99_ms_max = EXCLUDED.queue_p99_ms_max, ttft_slo_ms = EXCLUDED.ttft_slo_ms, e2e_slo_ms = EXCLUDED.e2e_slo_ms;
    INSERT INTO request_windows_1h (bucket, model, pool, replica, arm, windows, requests, ok, errors, timeouts, cancelled, rejected, prompt_tokens, output_tokens, ttft_within_slo, e2e_within_slo, ttft_count, ttft_sum_ms, e2e_sum_ms, itl_n, itl_sum_ms, itl_sumsq_ms2, ttft_p99_ms_max, e2e_p99_ms_max, queue_p99_ms_max, ttft_slo_ms, e2e_slo_ms)
    SELECT g.b, g.model, g.pool, g.replica, g.arm, a.*
    FROM (SELECT DISTINCT date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, model, pool, replica, arm FROM llmsla_new_rows) g,
    LATERAL (SELECT sum(windows) AS windows, sum(requests) AS requests, sum(ok) AS ok, sum(errors) AS errors, sum(timeouts) AS timeouts, sum(cancelled) AS cancelled, sum(rejected) AS rejected, sum(prompt_tokens) AS prompt_tokens, sum(output_tokens) AS output_tokens, sum(ttft_within_slo) AS ttft_within_slo, sum(e2e_within_slo) AS e2e_within_slo, sum(ttft_count) AS ttft_count, sum(ttft_sum_ms) AS ttft_sum_ms, sum(e2e_sum_ms) AS e2e_sum_ms, sum(itl_n) AS itl_n, sum(itl_sum_ms) AS itl_sum_ms, sum(itl_sumsq_ms2) AS itl_sumsq_ms2, max(ttft_p99_ms_max) AS ttft_p99_ms_max, max(e2e_p99_ms_max) AS e2e_p99_ms_max, max(queue_p99_ms_max) AS queue_p99_ms_max, max(ttft_slo_ms) AS ttft_slo_ms, max(e2e_slo_ms) AS e2e_slo_ms FROM request_windows_1m s
             WHERE s.bucket >= g.b AND s.bucket < g.b + INTERVAL '1 hour' AND s.model = g.model AND s.pool = g.pool AND s.replica = g.replica AND s.arm = g.arm) a
    WHERE a.windows > 0
    ON CONFLICT (bucket, model, pool, replica, arm) DO UPDATE SET windows = EXCLUDED.windows, requests = EXCLUDED.requests, ok = EXCLUDED.ok, errors = EXCLUDED.errors, timeouts = EXCLUDED.timeouts, cancelled = EXCLUDED.cancelled, rejected = EXCLUDED.rejected, prompt_tokens = EXCLUDED.prompt_tokens, output_tokens = EXCLUDED.output_tokens, ttft_within_slo = EXCLUDED.ttft_within_slo, e2e_within_slo = EXCLUDED.e2e_within_slo, ttft_count = EXCLUDED.ttft_count, ttft_sum_ms = EXCLUDED.ttft_sum_ms, e2e_sum_ms = EXCLUDED.e2e_sum_ms, itl_n = EXCLUDED.itl_n, itl_sum_ms = EXCLUDED.itl_sum_ms, itl_sumsq_ms2 = EXCLUDED.itl_sumsq_ms2, ttft_p99_ms_max = EXCLUDED.ttft_p99_ms_max, e2e_p99_ms_max = EXCLUDED.e2e_p99_ms_max, queue_p99_ms_max = EXCLUDED.queue_p99_ms_max, ttft_slo_ms = EXCLUDED.ttft_slo_ms, e2e_slo_ms = EXCLUDED.e2e_slo_ms;
    RETURN NULL;
END $$;

CREATE TRIGGER request_windows_rollup_insert AFTER INSERT ON request_windows
REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION llmsla_request_rollups();

CREATE TRIGGER request_windows_rollup_update AFTER UPDATE ON request_windows
REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION llmsla_request_rollups();
