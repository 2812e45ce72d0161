-- Plain PostgreSQL: tables backfilled from the stored forecasts and kept current by a
-- statement-level trigger on forecasts.
{{FORECAST_ROLLUP_TABLES}}
