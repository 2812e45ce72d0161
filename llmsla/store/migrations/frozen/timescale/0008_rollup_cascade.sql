-- The request roll-ups' insert trigger (plain PostgreSQL) adds each statement's windows to the
-- 1 m groups once, and the hour's groups from those 1 m deltas (0008_rollup_cascade.plain.sql).
-- TimescaleDB keeps its continuous aggregates: nothing to change there.

