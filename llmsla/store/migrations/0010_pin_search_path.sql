-- The histogram functions that call other llmsla functions resolve them with the search_path of
-- the store (the one this migration runs with), not their caller's: TimescaleDB refreshes
-- continuous aggregates with search_path = pg_catalog, pg_temp, where the roll-ups' quantile
-- aggregates could not find llmsla_hist_quantile. Stores created after this fix get the clause
-- from migration 0005; this one gives it to the stores created before.
{{PIN_SEARCH_PATH}}
