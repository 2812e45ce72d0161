-- TimescaleDB: the continuous aggregates are re-created with the histogram and quantile columns
-- (a continuous aggregate's query cannot be altered) and materialised from the 5 s windows; the
-- old ones are renamed *_pre0005 and no longer refreshed (drop them once their history is not needed).
{{ROLLUP_HIST_CAGGS}}
