-- Plain PostgreSQL: the 5 s table's roll-up triggers skip a transaction that set
-- llmsla.writer_minutes = 'on' (the stream job's sink, which writes complete minute rows), and
-- new triggers on the 1 m table add such minute rows to the hour
-- (llmsla.store.rollups.writer_minutes_ddl).
{{ROLLUP_WRITER_MINUTES}}
