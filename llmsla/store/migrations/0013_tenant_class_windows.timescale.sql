-- TimescaleDB: the hypertable back to the rowstore for its new key and segmentby, the
-- continuous aggregates created anew.
{{TENANT_CLASS_TIMESCALE}}
