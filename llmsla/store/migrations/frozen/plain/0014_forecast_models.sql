-- The forecaster's model registry (docs/forecaster.md#model-registry): every model trained from
-- the store, with where it came from (who, which history, which data set), how it scored
-- (validation and held-out metrics, and the gate's comparison), its status and the artifact
-- itself (a tar of the artifact directory, its sha256 checked on every load), so `forecast
-- serve` on any host serves the same champion without a shared file system. A handful of rows a
-- day at most: a plain table on both flavours. One champion at a time, held by the index.
CREATE TABLE IF NOT EXISTS forecast_models (
    id               bigserial    PRIMARY KEY,
    version          text         NOT NULL UNIQUE,
    created_at       timestamptz  NOT NULL DEFAULT now(),
    trained_by       text         NOT NULL,
    train_from       timestamptz,
    train_to         timestamptz,
    data_sha256      text         NOT NULL,
    metrics          jsonb        NOT NULL DEFAULT '{}'::jsonb,
    status           text         NOT NULL DEFAULT 'candidate'
                                  CHECK (status IN ('candidate', 'champion', 'retired', 'refused')),
    reason           text         NOT NULL DEFAULT '',
    status_at        timestamptz  NOT NULL DEFAULT now(),
    artifact         bytea        NOT NULL,
    artifact_sha256  text         NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS forecast_models_one_champion ON forecast_models ((true))
    WHERE status = 'champion';

