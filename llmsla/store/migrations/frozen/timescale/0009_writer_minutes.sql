-- The stream job writes the request roll-ups' complete 1 m rows itself, summed on the JVM
-- (0009_writer_minutes.plain.sql); TimescaleDB keeps its continuous aggregates: nothing here.

