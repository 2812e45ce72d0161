-- 5 s engine windows per (pool, replica, engine): what each replica's own /metrics said
-- (EngineSample, docs/engines.md), windowed by the stream job (docs/streaming.md#windows).
-- Gauges as mean and max over the window's samples; counter increases summed over consecutive
-- samples of the replica (reset-safe); the engine's own TTFT from its histogram's sum and count
-- increases. A value the engine does not expose is null, never 0.
CREATE TABLE IF NOT EXISTS engine_windows (
    bucket                      timestamptz      NOT NULL,
    pool                        text             NOT NULL,
    replica                     text             NOT NULL,
    engine                      text             NOT NULL,
    samples                     bigint           NOT NULL,
    waiting_mean                double precision,
    waiting_max                 double precision,
    running_mean                double precision,
    running_max                 double precision,
    kv_usage_mean               double precision,
    kv_usage_max                double precision,
    preemptions                 double precision,
    prefix_cache_hit_rate_mean  double precision,
    engine_ttft_count           double precision,
    engine_ttft_sum_ms          double precision,
    engine_ttft_mean_ms         double precision,
    counter_resets              bigint           NOT NULL,
    updated_at                  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (bucket, pool, replica, engine)
) PARTITION BY RANGE (bucket);

-- Plain PostgreSQL: daily partitions (llmsla_ensure_partitions, run by maintenance after every
-- migrate) and BRIN on time, like the other window tables.
CREATE INDEX IF NOT EXISTS engine_windows_bucket_brin ON engine_windows USING brin (bucket);
