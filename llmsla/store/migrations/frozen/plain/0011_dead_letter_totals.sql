-- Dead letters ever stored, per source and reason category: a running total that retention does
-- not take back when it drops old dead_letters partitions or chunks, so llmsla_dead_letters_total
-- (streaming/health.py) is a real counter. Kept by a row trigger: TimescaleDB hypertables take no
-- transition tables, and a dead letter is rare. Backfilled from the dead letters still stored.
CREATE TABLE IF NOT EXISTS dead_letter_totals (
    source     text        NOT NULL,
    reason     text        NOT NULL,
    records    bigint      NOT NULL,
    last_seen  timestamptz NOT NULL,
    PRIMARY KEY (source, reason)
);

INSERT INTO dead_letter_totals (source, reason, records, last_seen)
SELECT source, split_part(reason, ':', 1), count(*), max(received_at)
FROM dead_letters
GROUP BY source, split_part(reason, ':', 1)
ON CONFLICT (source, reason) DO NOTHING;

CREATE OR REPLACE FUNCTION llmsla_count_dead_letter() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO dead_letter_totals AS t (source, reason, records, last_seen)
    VALUES (NEW.source, split_part(NEW.reason, ':', 1), 1, NEW.received_at)
    ON CONFLICT (source, reason) DO UPDATE
        SET records = t.records + 1, last_seen = GREATEST(t.last_seen, EXCLUDED.last_seen);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS dead_letters_total ON dead_letters;
CREATE TRIGGER dead_letters_total AFTER INSERT ON dead_letters
FOR EACH ROW EXECUTE FUNCTION llmsla_count_dead_letter();

