package dev.llmsla.flink;

import java.util.HashSet;
import java.util.Set;
import java.util.TreeSet;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.ReadableConfig;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.connector.format.DecodingFormat;
import org.apache.flink.table.connector.source.DynamicTableSource;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.factories.DeserializationFormatFactory;
import org.apache.flink.table.factories.DynamicTableFactory;
import org.apache.flink.table.factories.FactoryUtil;
import org.apache.flink.table.types.DataType;
import org.apache.flink.table.types.logical.RowType;

/**
 * Table format {@code 'format' = 'llmsla-json'}: one spool JSON line per record, parsed once into
 * typed columns, with the raw line and the JSON-shape verdict kept as columns of their own.
 *
 * <p>Why not Flink's {@code json} format: it drops (or fails on) a line it cannot parse and never
 * exposes the raw line, so a dead letter could not carry it. Why not a scalar function over a
 * {@code raw} line: decoding every line into a Java String and re-encoding the fields costs more
 * than the parse itself. Here Jackson reads the line's UTF-8 bytes directly.
 *
 * <p>Columns: the {@code raw-column} (default {@code line}) gets the line; the {@code error-column}
 * (default {@code json_error}) gets null for a well-shaped object, else the first problem
 * ({@code parse}, {@code type:<path>}, {@code unknown:<path>}, {@code duplicate:<path>}); every
 * other column is a field read from the JSON path {@code paths} maps it to (default: its own name;
 * {@code a.b} is member b of object a), typed by the column: BIGINT, DOUBLE, STRING, or BYTES for
 * a string's UTF-8. Columns listed in {@code not-null} reject an explicit JSON null (the schema
 * version). The {@code time-column} option ({@code rt=ts_ms}) adds a TIMESTAMP_LTZ(3) copy of an
 * epoch-millisecond column, 1970 when it is null: the event-time attribute, without a computed
 * column (whose Calc would copy every string of every row once more). String values must be
 * storable ({@code max-string-chars} code points, no NUL, no lone surrogate). Blank lines (space,
 * tab, CR only) are skipped. See {@link SpoolJsonDeserializer} for the type and wire rules.
 */
public class SpoolJsonFormatFactory implements DeserializationFormatFactory {
    public static final String IDENTIFIER = "llmsla-json";

    public static final ConfigOption<String> PATHS = ConfigOptions.key("paths").stringType().defaultValue("")
            .withDescription("column=json.path pairs, comma separated, for columns named unlike their field");
    public static final ConfigOption<String> NOT_NULL = ConfigOptions.key("not-null").stringType().defaultValue("")
            .withDescription("comma separated columns whose field may be absent but not an explicit null");
    public static final ConfigOption<String> TIME_COLUMN = ConfigOptions.key("time-column").stringType().defaultValue("")
            .withDescription("timestamp=bigint: a TIMESTAMP_LTZ(3) column holding the epoch-millisecond BIGINT "
                    + "column (1970-01-01 when that is null), so the event-time attribute needs no computed column");
    public static final ConfigOption<String> RAW_COLUMN = ConfigOptions.key("raw-column").stringType().defaultValue("line")
            .withDescription("column that receives the raw line");
    public static final ConfigOption<String> ERROR_COLUMN = ConfigOptions.key("error-column").stringType()
            .defaultValue("json_error").withDescription("column that receives the JSON-shape problem, null if none");
    public static final ConfigOption<String> HISTOGRAMS = ConfigOptions.key("histograms").stringType().defaultValue("")
            .withDescription("comma separated top-level fields holding a cumulative histogram {le, counts, sum, "
                    + "count} (llmsla.events._parse_hist), checked in full; paths may read its sum and count");
    public static final ConfigOption<String> STRING_LISTS = ConfigOptions.key("string-lists").stringType().defaultValue("")
            .withDescription("comma separated top-level fields holding null or an array of storable strings "
                    + "(llmsla.events._parse_strings), checked and not stored");
    public static final ConfigOption<Integer> MAX_STRING_CHARS = ConfigOptions.key("max-string-chars").intType()
            .defaultValue(256).withDescription("longest string value in Unicode code points (llmsla.events."
                    + "MAX_STRING_CHARS); longer, or with a NUL or a lone surrogate, is a string:<path> problem");

    @Override
    public DecodingFormat<DeserializationSchema<RowData>> createDecodingFormat(
            DynamicTableFactory.Context context, ReadableConfig options) {
        FactoryUtil.validateFactoryOptions(this, options);
        Set<String> known = new HashSet<>();
        for (ConfigOption<?> option : optionalOptions()) {
            known.add(option.key());
        }
        for (String key : options.toMap().keySet()) { // a typo must not silently mean "default"
            String name = key.startsWith(IDENTIFIER + ".") ? key.substring(IDENTIFIER.length() + 1) : key;
            if (!known.contains(name)) {
                throw new ValidationException("Unsupported option '" + IDENTIFIER + "." + name
                        + "' of format " + IDENTIFIER + "; supported: " + new TreeSet<>(known));
            }
        }
        final String paths = options.get(PATHS);
        final String notNull = options.get(NOT_NULL);
        final String time = options.get(TIME_COLUMN);
        final String raw = options.get(RAW_COLUMN);
        final String error = options.get(ERROR_COLUMN);
        final int maxChars = options.get(MAX_STRING_CHARS);
        final String histograms = options.get(HISTOGRAMS);
        final String stringLists = options.get(STRING_LISTS);
        return new DecodingFormat<DeserializationSchema<RowData>>() {
            @Override
            public DeserializationSchema<RowData> createRuntimeDecoder(
                    DynamicTableSource.Context ctx, DataType physicalDataType) {
                RowType rowType = (RowType) physicalDataType.getLogicalType();
                TypeInformation<RowData> produced = ctx.createTypeInformation(physicalDataType);
                return new SpoolJsonDeserializer(rowType, produced, paths, notNull, time, raw, error, maxChars,
                        histograms, stringLists);
            }

            @Override
            public ChangelogMode getChangelogMode() {
                return ChangelogMode.insertOnly();
            }
        };
    }

    @Override
    public String factoryIdentifier() {
        return IDENTIFIER;
    }

    @Override
    public Set<ConfigOption<?>> requiredOptions() {
        return new HashSet<>();
    }

    @Override
    public Set<ConfigOption<?>> optionalOptions() {
        Set<ConfigOption<?>> options = new HashSet<>();
        options.add(PATHS);
        options.add(NOT_NULL);
        options.add(TIME_COLUMN);
        options.add(RAW_COLUMN);
        options.add(ERROR_COLUMN);
        options.add(MAX_STRING_CHARS);
        options.add(HISTOGRAMS);
        options.add(STRING_LISTS);
        return options;
    }
}
