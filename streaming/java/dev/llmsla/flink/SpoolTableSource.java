package dev.llmsla.flink;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.connector.format.DecodingFormat;
import org.apache.flink.table.connector.source.DynamicTableSource;
import org.apache.flink.table.connector.source.ScanTableSource;
import org.apache.flink.table.connector.source.SourceProvider;
import org.apache.flink.table.connector.source.abilities.SupportsReadingMetadata;
import org.apache.flink.table.connector.source.abilities.SupportsSourceWatermark;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.types.DataType;

/**
 * The {@code llmsla-spool} table: rows of the table's format, the {@code file.path} metadata
 * column, and {@code WATERMARK FOR rt AS SOURCE_WATERMARK()}: the watermark is the source's own
 * (SpoolReader), not a per-row expression, so it can hold back for segments not yet read.
 */
final class SpoolTableSource implements ScanTableSource, SupportsReadingMetadata, SupportsSourceWatermark {
    static final String FILE_PATH = "file.path";

    private final SpoolTableFactory.Settings settings;
    private final DecodingFormat<DeserializationSchema<RowData>> format;
    private final DataType physical;
    private final String rowtime;
    private List<String> metadata = Collections.emptyList();
    private DataType produced;
    private boolean watermarks;

    SpoolTableSource(SpoolTableFactory.Settings settings, DecodingFormat<DeserializationSchema<RowData>> format,
                     DataType physical, String rowtime) {
        this.settings = settings;
        this.format = format;
        this.physical = physical;
        this.rowtime = rowtime;
        this.produced = physical;
    }

    @Override
    public ChangelogMode getChangelogMode() {
        return ChangelogMode.insertOnly();
    }

    @Override
    public ScanRuntimeProvider getScanRuntimeProvider(ScanContext context) {
        DeserializationSchema<RowData> decoder = format.createRuntimeDecoder(context, physical);
        int timeIndex = rowtime == null ? -1 : DataType.getFieldNames(physical).indexOf(rowtime);
        if (watermarks && timeIndex < 0) {
            throw new ValidationException("llmsla-spool: SOURCE_WATERMARK() needs a physical rowtime column, got "
                    + rowtime);
        }
        SpoolTableFactory.Settings s = settings;
        return SourceProvider.of(new SpoolSource(s.dir, s.bounded, s.monitorMillis, s.delayMillis, s.intervalMillis,
                s.idleMillis, s.maxPastMillis, s.maxFutureMillis, decoder, context.createTypeInformation(produced),
                timeIndex, metadata.contains(FILE_PATH), watermarks));
    }

    @Override
    public Map<String, DataType> listReadableMetadata() {
        Map<String, DataType> out = new LinkedHashMap<>();
        // BYTES: the planner deep-copies a STRING at every Calc that reads it, once per row
        out.put(FILE_PATH, DataTypes.BYTES().notNull());
        return out;
    }

    @Override
    public void applyReadableMetadata(List<String> keys, DataType producedDataType) {
        metadata = new ArrayList<>(keys);
        produced = producedDataType;
    }

    @Override
    public void applySourceWatermark() {
        watermarks = true;
    }

    @Override
    public DynamicTableSource copy() {
        SpoolTableSource copy = new SpoolTableSource(settings, format, physical, rowtime);
        copy.metadata = new ArrayList<>(metadata);
        copy.produced = produced;
        copy.watermarks = watermarks;
        return copy;
    }

    @Override
    public String asSummaryString() {
        return "llmsla-spool(" + settings.dir + ")";
    }
}
