-- The alert receiver's audit columns, idempotency keys and per-target state. Same DDL on plain
-- PostgreSQL (ALTER on the partitioned parent reaches every partition) and TimescaleDB
-- (nullable columns without a default are a catalogue change on a hypertable).

-- One action_log row per received alert (action 'alert'), per decision and per control action:
-- the alert's status, the receiver's decision, how long the action took, and the idempotency
-- key that ties the rows of one delivery together. NULL for control API rows.
ALTER TABLE action_log ADD COLUMN IF NOT EXISTS alert_status text;
ALTER TABLE action_log ADD COLUMN IF NOT EXISTS decision     text;
ALTER TABLE action_log ADD COLUMN IF NOT EXISTS latency_ms   double precision;
ALTER TABLE action_log ADD COLUMN IF NOT EXISTS dedupe_key   text;

-- Idempotency: (group key or fingerprint, status, startsAt) of every alert ever acted on, so a
-- replayed or duplicated delivery (Alertmanager HA pairs, repeat_interval, retries, several
-- receivers behind one address) is recognised by whichever receiver gets it. Not partitioned:
-- the key must be unique across time; the receiver deletes rows older than store.retention_days.
CREATE TABLE IF NOT EXISTS alert_receipts (
    dedupe_key   text        PRIMARY KEY,
    fingerprint  text        NOT NULL,
    status       text        NOT NULL,
    starts_at    timestamptz NOT NULL,
    group_key    text        NOT NULL DEFAULT '',
    received_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS alert_receipts_received_at_idx ON alert_receipts (received_at);

-- The receiver's state per target ('replica:<pool>/<id>' or 'pool:<pool>'): firing causes,
-- stage, hold-down, baseline share. Updated under a per-target advisory lock, so several
-- receivers sharing the store act once per change and a restarted receiver resumes.
CREATE TABLE IF NOT EXISTS receiver_state (
    key         text        PRIMARY KEY,
    state       jsonb       NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

