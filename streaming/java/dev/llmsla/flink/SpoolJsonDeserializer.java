package dev.llmsla.flink;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonFactory;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonParser;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonToken;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.StreamReadConstraints;
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
 * field rejects strings and booleans; a STRING field rejects everything but a string, and so does a
 * BYTES field, which holds the string's UTF-8 bytes (see {@link #stringValue}). An unknown
 * field (top level or nested) and a repeated name are problems too (Python would keep the last
 * value: refuse to guess). Absent fields and JSON nulls are null columns: the job's SQL predicates
 * decide about them, and the contract names the reason. On any problem every field column is null,
 * so a malformed line never moves the event-time watermark.
 *
 * <p>The wire rules of llmsla/events.py {@code from_json} hold byte for byte, so {@code spool check}
 * and the job accept exactly the same lines: a line must be UTF-8 (strictly: no overlong forms, no
 * encoded surrogates; Jackson alone decodes those silently), must not start with a byte-order mark
 * (Jackson would skip it), and each name appears once, nested objects included. A string must be
 * storable ({@code string_problem}): no NUL, no lone surrogate, at most {@code max-string-chars}
 * Unicode code points (not UTF-16 units: an emoji is one). Problems: {@code parse}, {@code bom},
 * {@code utf8}, {@code type:<path>}, {@code unknown:<path>}, {@code duplicate:<path>},
 * {@code string:<path>}, and {@code truncated} (set by the spool source for a last line without a
 * newline). Blank lines (only space, tab, CR: llmsla.spool.BLANK_BYTES) yield no row.
 */
public class SpoolJsonDeserializer implements DeserializationSchema<RowData> {
    private static final long serialVersionUID = 1L;
    private static final double LONG_LIMIT = 9.223372036854775807E18;

    private final TypeInformation<RowData> produced;
    private final int arity;
    private final int rawIndex;
    /** The raw column is BYTES: the planner passes byte arrays on by reference, where it deep-copies
     *  a STRING at every Calc that reads it (TypeCheckUtils.isMutable): 13 % of the JVM's samples
     *  in a JFR profile of a store run. */
    private final boolean rawBytes;
    private final int errorIndex;
    /** The TIMESTAMP_LTZ column and the BIGINT column it copies (-1 when none). */
    private final int timeIndex;
    private final int timeSourceIndex;
    /** Per column: its JSON path (null for the raw and error columns) and type s (STRING), b (a
     *  string as BYTES), i, n or v. */
    private final String[] paths;
    private final char[] types;
    /** Longest storable string in code points (0: no limit). */
    private final int maxStringChars;
    /** Top-level fields holding a histogram {le, counts, sum, count}, and those holding a list of
     *  strings (EngineSample): checked like llmsla.events does, only a histogram's sum and count
     *  reach columns (through paths such as {@code ttft_sum=ttft.sum}). */
    private final Set<String> histograms;
    private final Set<String> stringLists;
    /** Most items of a histogram's arrays and of a string list (llmsla.events MAX_BUCKETS, MAX_LIST_ITEMS). */
    private static final int MAX_ITEMS = 64;
    private static final String[] HIST_KEYS = {"le", "counts", "sum", "count"};
    /** The pseudo-path ({@code ttft.buckets}) of a column that takes a histogram's bounds and counts
     *  as {@link NativeHistogram#encode} writes them; no JSON key of that name is read. */
    static final String BUCKETS = "buckets";

    private transient JsonFactory factory;
    private transient Map<String, Integer> top;
    private transient Map<String, Map<String, Integer>> nested;
    /** Nested objects by name and the bit of {@link #seenObjects} that marks them read. */
    private transient Map<String, Integer> objectBits;
    /** Columns already filled in the current line (bit per column): a repeated name is a problem. */
    private transient long seen;
    /** Nested objects already read in the current line (a repeated one, even null, is a problem). */
    private transient long seenObjects;
    /** Whether the current line's bytes were checked to be strict UTF-8 (done once, lazily). */
    private transient boolean utf8Checked;

    public SpoolJsonDeserializer(RowType rowType, TypeInformation<RowData> produced, String pathOption,
                                 String notNullOption, String timeOption, String rawColumn, String errorColumn,
                                 int maxStringChars, String histogramOption, String stringListOption) {
        this.produced = produced;
        this.maxStringChars = maxStringChars;
        this.histograms = fieldSet(histogramOption);
        this.stringLists = fieldSet(stringListOption);
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
        boolean rawIsBytes = false;
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
                boolean bytes = name.equals(rawColumn) && isBytes(type);
                if (!isString(type) && !bytes) {
                    throw new ValidationException("llmsla-json: column " + name + " must be STRING"
                            + (name.equals(rawColumn) ? " or BYTES" : ""));
                }
                if (name.equals(rawColumn)) {
                    raw = i;
                    rawIsBytes = bytes;
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
                    if (isBytes(type)) {
                        types[i] = 'b';
                        break;
                    }
                    if (!isString(type)) {
                        throw new ValidationException("llmsla-json: column " + name + " must be BIGINT, DOUBLE, STRING or BYTES");
                    }
                    types[i] = 's';
            }
        }
        if (error < 0) {
            throw new ValidationException("llmsla-json: no error column '" + errorColumn + "' (a bad line would look good)");
        }
        rawIndex = raw;
        rawBytes = rawIsBytes;
        errorIndex = error;
        timeIndex = time;
        timeSourceIndex = timeSource;
    }

    private static Set<String> fieldSet(String option) {
        Set<String> out = new HashSet<>();
        for (String name : option.split(",")) {
            if (!name.isBlank()) {
                out.add(name.trim());
            }
        }
        return out;
    }

    private static boolean isBytes(LogicalType type) {
        switch (type.getTypeRoot()) {
            case VARBINARY:
            case BINARY:
                return true;
            default:
                return false;
        }
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
        // Python's json has no limit on a number's digits or a string's length (ints: 4300 digits,
        // then "not valid JSON"); Jackson's defaults (1000 digits, ...) would reject lines Python
        // accepts. Nesting needs no raise: a nested value at a known field is a type problem at once.
        StreamReadConstraints unlimited = StreamReadConstraints.builder().maxNumberLength(Integer.MAX_VALUE)
                .maxStringLength(Integer.MAX_VALUE).maxNameLength(Integer.MAX_VALUE).build();
        factory = JsonFactory.builder().enable(StreamReadFeature.USE_FAST_DOUBLE_PARSER)
                .streamReadConstraints(unlimited).build();
        top = new HashMap<>();
        nested = new HashMap<>();
        objectBits = new HashMap<>();
        for (int i = 0; i < arity; i++) {
            String path = paths[i];
            if (path == null) {
                continue;
            }
            int dot = path.indexOf('.');
            if (dot < 0) {
                top.put(path, i);
            } else {
                String object = path.substring(0, dot);
                nested.computeIfAbsent(object, k -> new HashMap<>()).put(path.substring(dot + 1), i);
                objectBits.putIfAbsent(object, objectBits.size());
            }
        }
        for (String name : histograms) {
            nested.putIfAbsent(name, new HashMap<>()); // a histogram whose sum and count no column reads
            objectBits.putIfAbsent(name, objectBits.size());
        }
        for (String name : stringLists) {
            objectBits.putIfAbsent(name, objectBits.size());
        }
    }

    @Override
    public RowData deserialize(byte[] line) {
        return deserialize(line, 0);
    }

    /**
     * The row of one line with {@code trailing} extra null fields at the end (a source fills its
     * metadata columns there without copying the row); null for a blank line.
     */
    public GenericRowData deserialize(byte[] line, int trailing) {
        if (line == null || isBlank(line)) {
            return null;
        }
        if (factory == null) {
            init();
        }
        GenericRowData row = new GenericRowData(arity + trailing);
        String problem = null;
        seen = 0L;
        seenObjects = 0L;
        utf8Checked = false;
        if (line.length >= 3 && line[0] == (byte) 0xEF && line[1] == (byte) 0xBB && line[2] == (byte) 0xBF) {
            problem = "bom"; // Jackson would skip it; the contract rejects it
        } else if (hasNulHead(line)) {
            problem = "parse"; // Jackson would take the line for UTF-16/32; it is not JSON text
        } else {
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
                problem = utf8Checked || Utf8.isValid(line) ? "parse" : "utf8";
            }
        }
        return problem == null ? finish(row, line) : malformed(line, problem, trailing);
    }

    /** The row of a line that is not used (every field null, 1970 event time) with its problem. */
    public GenericRowData malformed(byte[] line, String problem, int trailing) {
        GenericRowData row = new GenericRowData(arity + trailing); // nothing of it is used, not even ts_ms
        row.setField(errorIndex, StringData.fromString(problem));
        return finish(row, line);
    }

    private GenericRowData finish(GenericRowData row, byte[] line) {
        if (rawIndex >= 0) {
            // the caller hands us a fresh copy
            row.setField(rawIndex, rawBytes ? line : StringData.fromBytes(line));
        }
        if (timeIndex >= 0) { // never null: the watermark operator rejects a null rowtime
            Object millis = row.getField(timeSourceIndex);
            row.setField(timeIndex, TimestampData.fromEpochMillis(millis == null ? 0L : (Long) millis));
        }
        return row;
    }

    /** llmsla.spool.is_blank: only space, tab and CR bytes (an empty line too). */
    public static boolean isBlank(byte[] line) {
        for (byte b : line) {
            if (b != ' ' && b != '\t' && b != '\r') {
                return false;
            }
        }
        return true;
    }

    private static boolean hasNulHead(byte[] line) {
        for (int i = 0; i < Math.min(4, line.length); i++) {
            if (line[i] == 0) {
                return true;
            }
        }
        return false;
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
                boolean bytes = types[slot] == 'b';
                if ((bytes || types[slot] == 's') && value == JsonToken.VALUE_STRING) {
                    Object text = stringValue(p, line, bytes);
                    if (text == null) {
                        return "string:" + prefix + name;
                    }
                    row.setField(slot, text);
                } else if (!convert(p, value, types[slot], row, slot)) {
                    return "type:" + prefix + name;
                }
                continue;
            }
            if (isTop && stringLists.contains(name)) {
                String problem = readStringList(p, value, name, line);
                if (problem != null) {
                    return problem;
                }
                continue;
            }
            Map<String, Integer> children = isTop ? nested.get(name) : null;
            if (children == null) {
                return "unknown:" + prefix + name;
            }
            long bit = 1L << objectBits.get(name);
            if ((seenObjects & bit) != 0) {
                return "duplicate:" + name;
            }
            seenObjects |= bit;
            if (value == JsonToken.VALUE_NULL) {
                continue; // its columns stay null; the SQL predicates reject that
            }
            if (value != JsonToken.START_OBJECT) {
                return "type:" + name;
            }
            String problem = histograms.contains(name) ? readHistogram(p, children, name, row)
                    : readObject(p, children, false, name + ".", row, line);
            if (problem != null) {
                return problem;
            }
        }
        if (t != JsonToken.END_OBJECT) {
            throw new IOException("malformed object");
        }
        return null;
    }

    /**
     * A histogram object (the parser after its START_OBJECT), checked as llmsla.events._parse_hist
     * does: the four keys once each and nothing else; {@code le} finite numbers, strictly
     * increasing; {@code counts} integers >= 0, as many, not decreasing, none above {@code count};
     * {@code sum} a finite number; {@code count} an integer >= 0. Its sum and count go to the
     * columns that read {@code name.sum} and {@code name.count}, if any, and its bounds and counts
     * to the column that reads {@code name.buckets}.
     */
    private String readHistogram(JsonParser p, Map<String, Integer> slots, String name, GenericRowData row)
            throws IOException {
        double[] le = null;
        long[] counts = null;
        Double sum = null;
        Long count = null;
        JsonToken t;
        while ((t = p.nextToken()) == JsonToken.FIELD_NAME) {
            String key = p.currentName();
            JsonToken value = p.nextToken();
            String where = name + "." + key;
            switch (key) {
                case "le":
                case "counts":
                    if ((key.equals("le") ? le != null : counts != null)) {
                        return "duplicate:" + where;
                    }
                    if (value != JsonToken.START_ARRAY) {
                        return "type:" + where;
                    }
                    double[] numbers = new double[MAX_ITEMS];
                    long[] ints = new long[MAX_ITEMS];
                    int n = 0;
                    JsonToken item;
                    while ((item = p.nextToken()) != JsonToken.END_ARRAY) {
                        if (n == MAX_ITEMS) {
                            return "items:" + where;
                        }
                        if (key.equals("le")) {
                            Double d = finiteNumber(p, item);
                            if (d == null) {
                                return "type:" + where;
                            }
                            numbers[n++] = d;
                        } else {
                            Long c = integer(p, item);
                            if (c == null || c < 0) {
                                return "type:" + where;
                            }
                            ints[n++] = c;
                        }
                    }
                    if (key.equals("le")) {
                        le = Arrays.copyOf(numbers, n);
                    } else {
                        counts = Arrays.copyOf(ints, n);
                    }
                    break;
                case "sum":
                    if (sum != null) {
                        return "duplicate:" + where;
                    }
                    sum = finiteNumber(p, value);
                    if (sum == null) {
                        return "type:" + where;
                    }
                    break;
                case "count":
                    if (count != null) {
                        return "duplicate:" + where;
                    }
                    count = integer(p, value);
                    if (count == null || count < 0) {
                        return "type:" + where;
                    }
                    break;
                default:
                    return "unknown:" + where;
            }
        }
        if (t != JsonToken.END_OBJECT) {
            throw new IOException("malformed object");
        }
        if (le == null || counts == null || sum == null || count == null) {
            return "missing:" + name;
        }
        if (le.length != counts.length) {
            return "histogram:" + name;
        }
        for (int i = 1; i < le.length; i++) {
            if (le[i] <= le[i - 1] || counts[i] < counts[i - 1]) {
                return "histogram:" + name;
            }
        }
        if (counts.length > 0 && counts[counts.length - 1] > count) {
            return "histogram:" + name;
        }
        Integer sumSlot = slots.get("sum");
        Integer countSlot = slots.get("count");
        if (sumSlot != null) {
            row.setField(sumSlot, sum);
        }
        if (countSlot != null) {
            row.setField(countSlot, count);
        }
        Integer bucketSlot = slots.get(BUCKETS);
        if (bucketSlot != null) { // the native buckets, for NativeHistogram (a STRING column)
            row.setField(bucketSlot, StringData.fromString(NativeHistogram.encode(le, counts, count)));
        }
        return null;
    }

    /** A list of strings (llmsla.events._parse_strings): null, or at most 64 storable, non-empty strings. */
    private String readStringList(JsonParser p, JsonToken value, String name, byte[] line) throws IOException {
        long bit = 1L << objectBits.get(name);
        if ((seenObjects & bit) != 0) {
            return "duplicate:" + name;
        }
        seenObjects |= bit;
        if (value == JsonToken.VALUE_NULL) {
            return null;
        }
        if (value != JsonToken.START_ARRAY) {
            return "type:" + name;
        }
        int n = 0;
        JsonToken item;
        while ((item = p.nextToken()) != JsonToken.END_ARRAY) {
            if (++n > MAX_ITEMS) {
                return "items:" + name;
            }
            if (item != JsonToken.VALUE_STRING) {
                return "type:" + name;
            }
            Object text = stringValue(p, line, true);
            if (text == null || ((byte[]) text).length == 0) {
                return "string:" + name;
            }
        }
        return null;
    }

    /** A JSON number as a finite double (Python: float(), beyond the float range is not finite); else null. */
    private static Double finiteNumber(JsonParser p, JsonToken t) throws IOException {
        if (t != JsonToken.VALUE_NUMBER_INT && t != JsonToken.VALUE_NUMBER_FLOAT) {
            return null;
        }
        double d = p.getDoubleValue();
        return Double.isFinite(d) ? d : null;
    }

    /** A JSON integer (or an integral number, as the contract accepts 12.0) in the 64-bit range; else null. */
    private static Long integer(JsonParser p, JsonToken t) throws IOException {
        if (t == JsonToken.VALUE_NUMBER_INT) {
            return p.getNumberType() == JsonParser.NumberType.BIG_INTEGER ? null : p.getLongValue();
        }
        if (t == JsonToken.VALUE_NUMBER_FLOAT) {
            double d = p.getDoubleValue();
            if (Double.isFinite(d) && d == Math.rint(d) && Math.abs(d) < LONG_LIMIT) {
                return (long) d;
            }
        }
        return null;
    }

    /** Stores one value; false when the JSON value does not have the column's type. */
    private static boolean convert(JsonParser p, JsonToken t, char type, GenericRowData row, int slot)
            throws IOException {
        if (t == JsonToken.VALUE_NULL) {
            return type != 'v';
        }
        switch (type) {
            case 's':
            case 'b':
                return false; // strings are read by stringValue

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
     * The current string value, or null when it cannot be stored (llmsla.events.string_problem, or
     * longer than the limit in code points). Fast path: a value of printable ASCII without escapes
     * is exactly its bytes in the line, so the string is a slice of the line (no decode, and no
     * re-encode when Flink copies or hashes it; Jackson skips the token). Anything else is decoded by
     * Jackson, after the whole line was checked once to be strict UTF-8 (Jackson accepts overlong
     * forms and encoded surrogates; Python does not).
     *
     * <p>{@code bytes}: the value's UTF-8 bytes (a BYTES column) instead of a StringData. The job
     * reads every string field as BYTES because the planner deep-copies a STRING column at every
     * Calc that reads it, once per row (TypeCheckUtils.isMutable), and passes byte arrays on by
     * reference:
     * with eight string fields per request that copy was ~12 % of the JVM's samples, and the
     * job's blackhole walls fell 9 % without it (docs/streaming.md).
     */
    private Object stringValue(JsonParser p, byte[] line, boolean bytes) throws IOException {
        long quote = p.getTokenLocation().getByteOffset();
        if (quote >= 0 && quote < line.length && line[(int) quote] == '"') {
            int start = (int) quote + 1;
            for (int i = start; i < line.length; i++) {
                byte b = line[i];
                if (b == '"') {
                    int length = i - start;
                    if (maxStringChars > 0 && length > maxStringChars) {
                        return null;
                    }
                    return bytes ? Arrays.copyOfRange(line, start, i) : StringData.fromBytes(line, start, length);
                }
                if (b == '\\' || b < 0x20) { // an escape, a control character or non-ASCII (< 0)
                    break;
                }
            }
        }
        if (!utf8Checked) {
            if (!Utf8.isValid(line)) {
                throw new IOException("not UTF-8");
            }
            utf8Checked = true;
        }
        String text = p.getText();
        if (!storable(text)) {
            return null;
        }
        return bytes ? text.getBytes(StandardCharsets.UTF_8) : StringData.fromString(text);
    }

    /** No NUL, no lone surrogate, at most maxStringChars code points. */
    private boolean storable(String text) {
        int points = 0;
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (c == 0) {
                return false;
            }
            if (Character.isHighSurrogate(c)) {
                if (i + 1 >= text.length() || !Character.isLowSurrogate(text.charAt(i + 1))) {
                    return false;
                }
                i++;
            } else if (Character.isLowSurrogate(c)) {
                return false;
            }
            points++;
        }
        return maxStringChars <= 0 || points <= maxStringChars;
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
