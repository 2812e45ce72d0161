-- Mergeable latency histograms: per 5 s request window, the TTFT and E2E bucket counts on the one
-- fixed log-spaced layout of llmsla.names.HIST_* (relative error <= 1 %), as integer arrays whose
-- subscripts are the bucket indices (only the range between the window's smallest and largest
-- value is stored). Windows written before this migration have none (NULL).
ALTER TABLE request_windows ADD COLUMN IF NOT EXISTS ttft_hist integer[], ADD COLUMN IF NOT EXISTS e2e_hist integer[];

-- llmsla_hist_add / llmsla_hist_sum (the sum of histograms), llmsla_hist_quantile(h, q) (the
-- quantile of llmsla.histogram.quantile, bucket values rendered from the same constants) and
-- llmsla_hist_p50/p95/p99 (aggregates the roll-ups use).
{{HIST_FUNCTIONS}}
