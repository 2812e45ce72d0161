-- Plain PostgreSQL: daily range partitions (created ahead by llmsla_ensure_partitions, with a
-- default partition so an unexpected day never loses rows), BRIN on time, roll-up views and
-- retention by dropping whole partitions (llmsla_drop_partitions).

CREATE OR REPLACE FUNCTION llmsla_ensure_partition(p_table text, p_col text, p_day date)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := format('%s_p%s', p_table, to_char(p_day, 'YYYYMMDD'));
    lo timestamptz := p_day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (p_day + 1)::timestamp AT TIME ZONE 'UTC';
    moved bigint;
BEGIN
    IF to_regclass(quote_ident(part)) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- Rows of that day that already landed in the default partition move into the new one.
    EXECUTE format('CREATE TEMP TABLE llmsla_move ON COMMIT DROP AS SELECT * FROM %I WHERE %I >= %L AND %I < %L',
                   p_table || '_default', p_col, lo, p_col, hi);
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved > 0 THEN
        EXECUTE format('DELETE FROM %I WHERE %I >= %L AND %I < %L', p_table || '_default', p_col, lo, p_col, hi);
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', part, p_table, lo, hi);
    IF moved > 0 THEN
        EXECUTE format('INSERT INTO %I SELECT * FROM llmsla_move', p_table);
    END IF;
    DROP TABLE llmsla_move;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION llmsla_ensure_partitions(p_table text, p_col text, p_from date, p_to date)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    d date;
    n integer := 0;
BEGIN
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I DEFAULT', p_table || '_default', p_table);
    -- Days present in the default partition (backfills, clock skew) get their own partition.
    FOR d IN EXECUTE format('SELECT DISTINCT (%I AT TIME ZONE ''UTC'')::date FROM %I', p_col, p_table || '_default') LOOP
        IF llmsla_ensure_partition(p_table, p_col, d) THEN n := n + 1; END IF;
    END LOOP;
    d := p_from;
    WHILE d <= p_to LOOP
        IF llmsla_ensure_partition(p_table, p_col, d) THEN n := n + 1; END IF;
        d := d + 1;
    END LOOP;
    RETURN n;
END $$;

-- Drops daily partitions that end at or before p_cutoff; old rows in the default partition
-- are deleted. Returns the number of partitions dropped.
CREATE OR REPLACE FUNCTION llmsla_drop_partitions(p_table text, p_col text, p_cutoff timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN
        SELECT c.relname FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE p.relname = p_table AND c.relname ~ ('^' || p_table || '_p[0-9]{8}$')
    LOOP
        IF ((to_date(right(r.relname, 8), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC') <= p_cutoff THEN
            EXECUTE format('DROP TABLE %I', r.relname);
            n := n + 1;
        END IF;
    END LOOP;
    IF to_regclass(quote_ident(p_table || '_default')) IS NOT NULL THEN
        EXECUTE format('DELETE FROM %I WHERE %I < %L', p_table || '_default', p_col, p_cutoff);
    END IF;
    RETURN n;
END $$;

CREATE INDEX IF NOT EXISTS request_windows_bucket_brin ON request_windows USING brin (bucket);
CREATE INDEX IF NOT EXISTS policy_windows_bucket_brin ON policy_windows USING brin (bucket);
CREATE INDEX IF NOT EXISTS gpu_windows_bucket_brin ON gpu_windows USING brin (bucket);
CREATE INDEX IF NOT EXISTS dead_letters_received_brin ON dead_letters USING brin (received_at);
CREATE INDEX IF NOT EXISTS forecasts_ts_brin ON forecasts USING brin (ts);
CREATE INDEX IF NOT EXISTS action_log_ts_brin ON action_log USING brin (ts);
CREATE INDEX IF NOT EXISTS ab_results_ts_brin ON ab_results USING brin (ts);

{{ROLLUP_VIEWS}}
