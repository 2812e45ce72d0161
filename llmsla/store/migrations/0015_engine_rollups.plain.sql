-- Plain PostgreSQL: tables backfilled from the stored engine windows and kept current by a
-- statement-level trigger on engine_windows.
{{ENGINE_ROLLUP_TABLES}}
