-- Plain PostgreSQL: the insert trigger sums the new 5 s windows into 1 m deltas once and adds
-- the hour's groups from those deltas instead of summing the 5 s rows a second time
-- (llmsla.store.rollups.rollup_cascade_ddl).
{{ROLLUP_CASCADE}}
