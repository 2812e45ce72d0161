package dev.llmsla.flink;

import java.io.IOException;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonFactory;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonParser;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonToken;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.StreamReadFeature;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.data.TimestampData;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.LogicalTypeRoot;
import org.apache.flink.table.types.logical.RowType;

/**
 * Parses one spool line (its UTF-8 bytes, no String decode) into a typed row; see
 * {@link SpoolJsonFormatFactory} for the columns.
 *
 * <p>Type strictness mirrors llmsla/events.py: a BIGINT field rejects strings, booleans and
 * non-integral or out-of-range numbers (an integral float such as 5.0 is accepted as 5); a DOUBLE
 * field rejects strings and booleans; a STRING field rejects everything but a string. An unknown
 * field (top level or nested) and a repeated name are problems too (Python would keep the last
 * value: refuse to guess). Absent fields and JSON nulls are null columns: the job's SQL predicates
 * decide about them, and the contract names the reason. On any problem every field column is null,
 * so a malformed line never moves the event-time watermark.
 */
public class SpoolJsonDeserializer implements DeserializationSchema<RowData> {
    private static final long serialVersionUID = 1L;
    private static final double LONG_LIMIT = 9.223372036854775807E18;

    private final TypeInformation<RowData> produced;
    private final int arity;
    private final int rawIndex;
    private final int errorIndex;
    /** The TIMESTAMP_LTZ column and the BIGINT column it copies (-1 when none). */
    private final int timeIndex;
    private final int timeSourceIndex;
    /** Per column: its JSON path (null for the raw and error columns) and type s, i, n or v. */
    private final String[] paths;
    private final char[] types;

    private transient JsonFactory factory;
    private transient Map<String, Integer> top;
    private transient Map<String, Map<String, Integer>> nested;
    /** Columns already filled in the current line (bit per column): a repeated name is a problem. */
    private transient long seen;

    public SpoolJsonDeserializer(RowType rowType, TypeInformation<RowData> produced, String pathOption,
                                 String notNullOption, String timeOption, String rawColumn, String errorColumn) {
        this.produced = produced;
        List<String> names = rowType.getFieldNames();
        arity = names.size();
        if (arity > 64) {
            throw new ValidationException("llmsla-json supports at most 64 columns");
        }
        Map<String, String> renamed = new HashMap<>();
        for (String pair : pathOption.split(",")) {
            if (pair.isBlank()) {
                continue;
            }
            int eq = pair.indexOf('=');
            if (eq <= 0 || !names.contains(pair.substring(0, eq).trim())) {
                throw new ValidationException("llmsla-json.paths: '" + pair + "' is not column=json.path of a column");
            }
            renamed.put(pair.substring(0, eq).trim(), pair.substring(eq + 1).trim());
        }
        List<String> notNull = Arrays.asList(notNullOption.split(","));
        String timeColumn = null;
        int timeSource = -1;
        if (!timeOption.isBlank()) {
            int eq = timeOption.indexOf('=');
            timeColumn = eq > 0 ? timeOption.substring(0, eq).trim() : "";
            timeSource = eq > 0 ? names.indexOf(timeOption.substring(eq + 1).trim()) : -1;
            if (!names.contains(timeColumn) || timeSource < 0
                    || rowType.getTypeAt(timeSource).getTypeRoot() != LogicalTypeRoot.BIGINT) {
                throw new ValidationException("llmsla-json.time-column: '" + timeOption
                        + "' is not timestamp_column=bigint_column of two columns");
            }
        }
        int time = -1;
        paths = new String[arity];
        types = new char[arity];
        int raw = -1;
        int error = -1;
        for (int i = 0; i < arity; i++) {
            String name = names.get(i);
            LogicalType type = rowType.getTypeAt(i);
            if (name.equals(timeColumn)) {
                if (type.getTypeRoot() != LogicalTypeRoot.TIMESTAMP_WITH_LOCAL_TIME_ZONE) {
                    throw new ValidationException("llmsla-json: column " + name + " must be TIMESTAMP_LTZ(3)");
                }
                time = i;
                continue;
            }
            if (name.equals(rawColumn) || name.equals(errorColumn)) {
                if (!isString(type)) {
                    throw new ValidationException("llmsla-json: column " + name + " must be STRING");
                }
                if (name.equals(rawColumn)) {
                    raw = i;
                } else {
                    error = i;
                }
                continue;
            }
            String path = renamed.getOrDefault(name, name);
            if (path.indexOf('.') != path.lastIndexOf('.')) {
                throw new ValidationException("llmsla-json: path " + path + " nests more than one level");
            }
            if (Arrays.asList(paths).contains(path)) {
                throw new ValidationException("llmsla-json: two columns read the JSON path " + path);
            }
            paths[i] = path;
            switch (type.getTypeRoot()) {
                case BIGINT:
                    types[i] = notNull.contains(name) ? 'v' : 'i';
                    break;
                case DOUBLE:
                    types[i] = 'n';
                    break;
                default:
                    if (!isString(type)) {
                        throw new ValidationException("llmsla-json: column " + name + " must be BIGINT, DOUBLE or STRING");
                    }
                    types[i] = 's';
            }
        }
        if (error < 0) {
            throw new ValidationException("llmsla-json: no error column '" + errorColumn + "' (a bad line would look good)");
        }
        rawIndex = raw;
        errorIndex = error;
        timeIndex = time;
        timeSourceIndex = timeSource;
    }

    private static boolean isString(LogicalType type) {
        switch (type.getTypeRoot()) {
            case VARCHAR:
            case CHAR:
                return true;
            default:
                return false;
        }
    }

    private void init() {
        // exact (correctly rounded) like Double.parseDouble, several times faster
        factory = JsonFactory.builder().enable(StreamReadFeature.USE_FAST_DOUBLE_PARSER).build();
        top = new HashMap<>();
        nested = new HashMap<>();
        for (int i = 0; i < arity; i++) {
            String path = paths[i];
            if (path == null) {
                continue;
            }
            int dot = path.indexOf('.');
            if (dot < 0) {
                top.put(path, i);
            } else {
                nested.computeIfAbsent(path.substring(0, dot), k -> new HashMap<>()).put(path.substring(dot + 1), i);
            }
        }
    }

    @Override
    public RowData deserialize(byte[] line) {
        if (line == null || isBlank(line)) {
            return null;
        }
        if (factory == null) {
            init();
        }
        GenericRowData row = new GenericRowData(arity);
        String problem;
        seen = 0L;
        try (JsonParser p = factory.createParser(line)) {
            if (p.nextToken() != JsonToken.START_OBJECT) {
                problem = "parse";
            } else {
                problem = readObject(p, top, true, "", row, line);
                if (problem == null && p.nextToken() != null) {
                    problem = "parse"; // trailing content after the object
                }
            }
        } catch (IOException | RuntimeException e) {
            problem = "parse";
        }
        if (problem != null) {
            row = new GenericRowData(arity); // no field of a malformed line is used, not even ts_ms
            row.setField(errorIndex, StringData.fromString(problem));
        }
        if (rawIndex >= 0) {
            row.setField(rawIndex, StringData.fromBytes(line)); // the adapter hands us a fresh copy
        }
        if (timeIndex >= 0) { // never null: the watermark operator rejects a null rowtime
            Object millis = row.getField(timeSourceIndex);
            row.setField(timeIndex, TimestampData.fromEpochMillis(millis == null ? 0L : (Long) millis));
        }
        return row;
    }

    private static boolean isBlank(byte[] line) {
        for (byte b : line) {
            if (b != ' ') {
                return false;
            }
        }
        return true;
    }

    /** Reads the current object's fields into the row; the first problem, or null. */
    private String readObject(JsonParser p, Map<String, Integer> slots, boolean isTop, String prefix,
                              GenericRowData row, byte[] line) throws IOException {
        JsonToken t;
        while ((t = p.nextToken()) == JsonToken.FIELD_NAME) {
            String name = p.currentName();
            JsonToken value = p.nextToken();
            Integer slot = slots.get(name);
            if (slot != null) {
                if ((seen & (1L << slot)) != 0) {
                    return "duplicate:" + prefix + name;
                }
                seen |= 1L << slot;
                if (!convert(p, value, types[slot], row, slot, line)) {
                    return "type:" + prefix + name;
                }
                continue;
            }
            Map<String, Integer> children = isTop ? nested.get(name) : null;
            if (children == null) {
                return "unknown:" + prefix + name;
            }
            if (value == JsonToken.VALUE_NULL) {
                continue; // its columns stay null; the SQL predicates reject that
            }
            if (value != JsonToken.START_OBJECT) {
                return "type:" + name;
            }
            String problem = readObject(p, children, false, name + ".", row, line);
            if (problem != null) {
                return problem;
            }
        }
        if (t != JsonToken.END_OBJECT) {
            throw new IOException("malformed object");
        }
        return null;
    }

    /** Stores one value; false when the JSON value does not have the column's type. */
    private static boolean convert(JsonParser p, JsonToken t, char type, GenericRowData row, int slot,
                                   byte[] line) throws IOException {
        if (t == JsonToken.VALUE_NULL) {
            return type != 'v';
        }
        switch (type) {
            case 's':
                if (t != JsonToken.VALUE_STRING) {
                    return false;
                }
                row.setField(slot, stringValue(p, line));
                return true;
            case 'n':
                if (t != JsonToken.VALUE_NUMBER_INT && t != JsonToken.VALUE_NUMBER_FLOAT) {
                    return false;
                }
                row.setField(slot, p.getDoubleValue());
                return true;
            default: // 'i', 'v'
                if (t == JsonToken.VALUE_NUMBER_INT) {
                    if (p.getNumberType() == JsonParser.NumberType.BIG_INTEGER) {
                        return false;
                    }
                    row.setField(slot, p.getLongValue());
                    return true;
                }
                if (t == JsonToken.VALUE_NUMBER_FLOAT) {
                    double d = p.getDoubleValue();
                    if (Double.isFinite(d) && d == Math.rint(d) && Math.abs(d) < LONG_LIMIT) {
                        row.setField(slot, (long) d);
                        return true;
                    }
                }
                return false;
        }
    }

    /**
     * The current string value. Fast path: a value of printable ASCII without escapes is exactly
     * its bytes in the line, so the string is a slice of the line (no decode, and no re-encode
     * when Flink copies or hashes it; Jackson skips the token). Anything else is decoded by Jackson.
     */
    private static StringData stringValue(JsonParser p, byte[] line) throws IOException {
        long quote = p.getTokenLocation().getByteOffset();
        if (quote >= 0 && quote < line.length && line[(int) quote] == '"') {
            int start = (int) quote + 1;
            for (int i = start; i < line.length; i++) {
                byte b = line[i];
                if (b == '"') {
                    return StringData.fromBytes(line, start, i - start);
                }
                if (b == '\\' || b < 0x20) { // an escape, a control character or non-ASCII (< 0)
                    break;
                }
            }
        }
        return StringData.fromString(p.getText());
    }

    @Override
    public boolean isEndOfStream(RowData next) {
        return false;
    }

    @Override
    public TypeInformation<RowData> getProducedType() {
        return produced;
    }
}
