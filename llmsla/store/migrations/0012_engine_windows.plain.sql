-- Plain PostgreSQL: daily partitions (llmsla_ensure_partitions, run by maintenance after every
-- migrate) and BRIN on time, like the other window tables.
CREATE INDEX IF NOT EXISTS engine_windows_bucket_brin ON engine_windows USING brin (bucket);
