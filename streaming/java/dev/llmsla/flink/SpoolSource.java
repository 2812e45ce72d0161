package dev.llmsla.flink;

import java.nio.file.Paths;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.connector.source.Boundedness;
import org.apache.flink.api.connector.source.Source;
import org.apache.flink.api.connector.source.SourceReader;
import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.api.connector.source.SplitEnumerator;
import org.apache.flink.api.connector.source.SplitEnumeratorContext;
import org.apache.flink.api.java.typeutils.ResultTypeQueryable;
import org.apache.flink.core.io.SimpleVersionedSerializer;
import org.apache.flink.table.data.RowData;

/**
 * The spool as a FLIP-27 source: {@link SpoolEnumerator} finds segments and routes them by writer,
 * {@link SpoolReader} reads them in order of start and emits a watermark per reader (what a Kafka
 * source gives per partition, for a directory of per-writer segment files).
 */
public final class SpoolSource implements Source<RowData, SpoolSplit, SpoolEnumerator.State>,
        ResultTypeQueryable<RowData> {
    private static final long serialVersionUID = 1L;

    private final String dir;
    private final boolean bounded;
    private final long monitorMillis;
    private final long delayMillis;
    private final long intervalMillis;
    private final long idleMillis;
    private final long maxPastMillis;
    private final long maxFutureMillis;
    private final DeserializationSchema<RowData> format;
    private final TypeInformation<RowData> produced;
    private final int timeIndex;
    private final boolean withPath;
    private final boolean watermarks;

    SpoolSource(String dir, boolean bounded, long monitorMillis, long delayMillis, long intervalMillis,
                long idleMillis, long maxPastMillis, long maxFutureMillis, DeserializationSchema<RowData> format,
                TypeInformation<RowData> produced, int timeIndex, boolean withPath, boolean watermarks) {
        this.dir = dir;
        this.bounded = bounded;
        this.monitorMillis = monitorMillis;
        this.delayMillis = delayMillis;
        this.intervalMillis = intervalMillis;
        this.idleMillis = idleMillis;
        this.maxPastMillis = maxPastMillis;
        this.maxFutureMillis = maxFutureMillis;
        this.format = format;
        this.produced = produced;
        this.timeIndex = timeIndex;
        this.withPath = withPath;
        this.watermarks = watermarks;
    }

    @Override
    public Boundedness getBoundedness() {
        return bounded ? Boundedness.BOUNDED : Boundedness.CONTINUOUS_UNBOUNDED;
    }

    @Override
    public SourceReader<RowData, SpoolSplit> createReader(SourceReaderContext context) throws Exception {
        return SpoolReader.create(context, this);
    }

    @Override
    public SplitEnumerator<SpoolSplit, SpoolEnumerator.State> createEnumerator(
            SplitEnumeratorContext<SpoolSplit> context) {
        return restoreEnumerator(context, null);
    }

    @Override
    public SplitEnumerator<SpoolSplit, SpoolEnumerator.State> restoreEnumerator(
            SplitEnumeratorContext<SpoolSplit> context, SpoolEnumerator.State state) {
        return new SpoolEnumerator(context, Paths.get(dir), bounded, monitorMillis, maxPastMillis, maxFutureMillis, state);
    }

    @Override
    public SimpleVersionedSerializer<SpoolSplit> getSplitSerializer() {
        return SpoolSplit.Serializer.INSTANCE;
    }

    @Override
    public SimpleVersionedSerializer<SpoolEnumerator.State> getEnumeratorCheckpointSerializer() {
        return SpoolEnumerator.StateSerializer.INSTANCE;
    }

    @Override
    public TypeInformation<RowData> getProducedType() {
        return produced;
    }

    DeserializationSchema<RowData> format() {
        return format;
    }

    long delayMillis() {
        return delayMillis;
    }

    long intervalMillis() {
        return intervalMillis;
    }

    long idleMillis() {
        return idleMillis;
    }

    long maxPastMillis() {
        return maxPastMillis;
    }

    long maxFutureMillis() {
        return maxFutureMillis;
    }

    int timeIndex() {
        return timeIndex;
    }

    boolean withPath() {
        return withPath;
    }

    boolean emitsWatermarks() {
        return watermarks;
    }
}
