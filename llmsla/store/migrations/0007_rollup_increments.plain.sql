-- Plain PostgreSQL: the request roll-up triggers add new windows to their 1 m / 1 h groups and
-- take a replayed window's old values back, instead of re-aggregating every touched group from
-- its rows on each write (llmsla.store.rollups.rollup_increments_ddl).
{{ROLLUP_INCREMENTS}}
