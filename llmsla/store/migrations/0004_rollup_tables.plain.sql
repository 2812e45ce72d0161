-- Plain PostgreSQL: request_windows_1m / request_windows_1h were views over the 5 s table, so a
-- 7-day query aggregated every 5 s row and the roll-ups vanished with the 5 s partitions. They
-- become tables with the same columns, backfilled here and kept current by a statement-level
-- trigger on request_windows (llmsla.store.rollups.rollup_tables_ddl renders the SQL).

{{ROLLUP_TABLES}}
