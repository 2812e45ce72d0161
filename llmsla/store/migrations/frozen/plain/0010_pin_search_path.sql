-- The histogram functions that call other llmsla functions resolve them with the search_path of
-- the store (the one this migration runs with), not their caller's: TimescaleDB refreshes
-- continuous aggregates with search_path = pg_catalog, pg_temp, where the roll-ups' quantile
-- aggregates could not find llmsla_hist_quantile. Stores created after this fix get the clause
-- from migration 0005; this one gives it to the stores created before.
ALTER FUNCTION llmsla_hist_quantile(bigint[], double precision) SET search_path FROM CURRENT;
ALTER FUNCTION llmsla_hist_merge(bigint[], bigint[], bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION llmsla_hist_final_p50(bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION llmsla_hist_final_p95(bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION llmsla_hist_final_p99(bigint[]) SET search_path FROM CURRENT;

