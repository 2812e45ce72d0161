-- The request roll-ups become materialised on plain PostgreSQL (0003_rollup_tables.plain.sql);
-- TimescaleDB's continuous aggregates already are. Names and columns do not change.

