-- Plain PostgreSQL: the roll-up tables gain ttft_hist/e2e_hist (summed) and the range's
-- ttft/e2e p50/p95/p99 (from the summed counts); the trigger function is re-rendered to keep them.
{{ROLLUP_HIST_TABLES}}
