-- Faster histogram quantiles (the bucket values no longer parsed on every call) and
-- llmsla_hist_merge (a histogram plus/minus another, with its quantiles in one pass): the
-- histogram functions are re-rendered (CREATE OR REPLACE).
{{HIST_FUNCTIONS}}
