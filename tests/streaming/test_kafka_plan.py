"""The Kafka source stays compiled: the whole job (store sink) is planned with
``stream.source = kafka``, its DDL going through a stand-in ``kafka`` connector that validates
options like the real one and decodes with the real ``llmsla-json`` format.

Why a stand-in: the job cannot run Kafka here (no broker) and the real connector jar
(``flink-sql-connector-kafka``, docs/streaming.md) is not vendored; without any ``kafka`` factory the
planner refuses the DDL before it reaches the format or the watermark, so a broken Kafka path would
go unnoticed. The stand-in is compiled here with javac and handed to the job as
``stream.kafka_jar``, the way the real jar is (``pipeline.jars``). It accepts the options the real
``KafkaDynamicTableFactory`` documents for what the DDL sets (``topic``, ``scan.startup.mode``,
``properties.*``, ``format``) and refuses any other, so a misspelled option in the DDL fails here."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla import names
from llmsla.streaming import jar, sql

STUB = r"""
package dev.llmsla.test;

import java.util.HashSet;
import java.util.Set;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.connector.source.Source;
import org.apache.flink.api.connector.source.lib.NumberSequenceSource;
import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.connector.format.DecodingFormat;
import org.apache.flink.table.connector.source.DynamicTableSource;
import org.apache.flink.table.connector.source.ScanTableSource;
import org.apache.flink.table.connector.source.SourceProvider;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.factories.DeserializationFormatFactory;
import org.apache.flink.table.factories.DynamicTableSourceFactory;
import org.apache.flink.table.factories.FactoryUtil;
import org.apache.flink.table.types.DataType;

public class KafkaStandIn implements DynamicTableSourceFactory {
    static final ConfigOption<String> TOPIC = ConfigOptions.key("topic").stringType().noDefaultValue();
    static final ConfigOption<String> STARTUP = ConfigOptions.key("scan.startup.mode").stringType().noDefaultValue();

    public String factoryIdentifier() { return "kafka"; }

    public Set<ConfigOption<?>> requiredOptions() {
        Set<ConfigOption<?>> o = new HashSet<>();
        o.add(TOPIC);
        o.add(FactoryUtil.FORMAT);
        return o;
    }

    public Set<ConfigOption<?>> optionalOptions() {
        Set<ConfigOption<?>> o = new HashSet<>();
        o.add(STARTUP);
        return o;
    }

    public DynamicTableSource createDynamicTableSource(Context context) {
        FactoryUtil.TableFactoryHelper helper = FactoryUtil.createTableFactoryHelper(this, context);
        DecodingFormat<DeserializationSchema<RowData>> format =
                helper.discoverDecodingFormat(DeserializationFormatFactory.class, FactoryUtil.FORMAT);
        helper.validateExcept("properties.");  // the Kafka client's own settings, as the real factory
        String startup = helper.getOptions().get(STARTUP);
        if (startup != null && !Set.of("earliest-offset", "latest-offset", "group-offsets", "timestamp",
                "specific-offsets").contains(startup)) {
            throw new IllegalArgumentException("scan.startup.mode: " + startup);
        }
        if (context.getCatalogTable().getOptions().get("properties.bootstrap.servers") == null) {
            throw new IllegalArgumentException("properties.bootstrap.servers is required");
        }
        return new Scan(format, context.getPhysicalRowDataType(), helper.getOptions().get(TOPIC));
    }

    static final class Scan implements ScanTableSource {
        final DecodingFormat<DeserializationSchema<RowData>> format;
        final DataType physical;
        final String topic;

        Scan(DecodingFormat<DeserializationSchema<RowData>> format, DataType physical, String topic) {
            this.format = format;
            this.physical = physical;
            this.topic = topic;
        }

        public ChangelogMode getChangelogMode() { return ChangelogMode.insertOnly(); }

        @SuppressWarnings({"unchecked", "rawtypes"})
        public ScanRuntimeProvider getScanRuntimeProvider(ScanContext context) {
            format.createRuntimeDecoder(context, physical);  // the format accepts these columns
            return SourceProvider.of((Source) new NumberSequenceSource(0, 0));  // never run
        }

        public DynamicTableSource copy() { return new Scan(format, physical, topic); }

        public String asSummaryString() { return "kafka stand-in " + topic; }
    }
}
"""


@pytest.fixture(scope="module")
def stand_in_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    javac = jar.find_javac()
    assert javac, "javac is needed to compile the Kafka stand-in (and the job's own Java parts)"
    lib, _ = jar._pyflink_lib()
    root = tmp_path_factory.mktemp("kafka-stand-in")
    src = root / "src" / "dev" / "llmsla" / "test" / "KafkaStandIn.java"
    src.parent.mkdir(parents=True)
    src.write_text(STUB)
    classes = root / "classes"
    done = subprocess.run([javac, "-nowarn", "--release", "11", "-d", str(classes), "-cp", str(lib / "*"), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = root / "kafka-stand-in.jar"
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("META-INF/services/org.apache.flink.table.factories.Factory", "dev.llmsla.test.KafkaStandIn\n")
        for cls in classes.rglob("*.class"):
            zf.write(cls, cls.relative_to(classes).as_posix())
    return out


def _kafka_cfg(tmp_path: Path, kafka_jar: Path) -> config_mod.Config:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.stream.checkpoint_dir = str(tmp_path / "ckpt")
    cfg.stream.source = "kafka"
    cfg.stream.kafka_bootstrap = "kafka-0.kafka:9092,kafka-1.kafka:9092"
    cfg.stream.kafka_jar = str(kafka_jar)
    return cfg


def test_kafka_ddl_names_topics_and_group() -> None:
    cfg = config_mod.load(env={})
    cfg.stream.source, cfg.stream.kafka_bootstrap = "kafka", "b:9092"
    for kind in names.SPOOL_KINDS:
        ddl = sql.source_ddl(cfg, kind, bounded=False, java=True)
        assert f"'topic' = 'llmsla.{kind}'" in ddl and "'properties.bootstrap.servers' = 'b:9092'" in ddl
        assert "'properties.group.id' = 'llmsla-stream'" in ddl and "'format' = 'llmsla-json'" in ddl
        assert "SOURCE_WATERMARK()" not in ddl  # per-partition watermarks from the row time instead


def test_whole_job_plans_with_the_kafka_source(tmp_path: Path, stand_in_jar: Path) -> None:
    from llmsla.streaming import job

    cfg = _kafka_cfg(tmp_path, stand_in_jar)
    settings = job.flink_settings(cfg, job.JobOptions(bounded=False, resume=False))
    assert settings["pipeline.jars"] == stand_in_jar.resolve().as_uri()  # shipped like the real jar
    env, _t_env, _ = job.build(cfg, job.JobOptions(bounded=False, resume=False))
    plan = json.loads(env.get_execution_plan())
    kinds = len(names.SPOOL_ALL_KINDS)
    sources = [n for n in plan["nodes"] if n["type"].startswith("Source: spool_")]
    assert len(sources) == kinds, plan
    # the row-time watermark (one per kind, so windows and dead letters agree), the store sink
    assert sum(1 for n in plan["nodes"] if n["type"].startswith("WatermarkAssigner")) == kinds, plan
    assert any(n["type"].startswith("store-sink") for n in plan["nodes"]), plan
    text = json.dumps(plan)
    assert "JSON_VALUE(" not in text  # parsed once by the llmsla-json format
    assert text.count("'late'") == kinds


def test_a_misspelled_kafka_option_fails_the_plan(tmp_path: Path, stand_in_jar: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in is strict: the test above would catch a Kafka DDL the real connector refuses."""
    from llmsla.streaming import job

    real = sql.source_ddl
    monkeypatch.setattr(sql, "source_ddl", lambda *a, **k: real(*a, **k).replace("'scan.startup.mode'", "'scan.start.mode'"))
    with pytest.raises(Exception, match="scan.start.mode"):
        job.build(_kafka_cfg(tmp_path, stand_in_jar), job.JobOptions(bounded=False, resume=False))
