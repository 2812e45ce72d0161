-- Dead-letter counters per spool kind and reason category (the text before the first ':' of
-- `reason`: parse, schema, future, past, late), for dashboards and alerts. The streaming job's
-- fingerprints make dead_letters idempotent, so these counts are exact across replays.
CREATE OR REPLACE VIEW dead_letter_counts AS
SELECT source,
       split_part(reason, ':', 1) AS reason,
       count(*)                   AS records,
       min(received_at)           AS first_seen,
       max(received_at)           AS last_seen
FROM dead_letters
GROUP BY source, split_part(reason, ':', 1);

