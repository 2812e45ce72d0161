package dev.llmsla.flink;

import java.io.IOException;
import java.util.HashMap;
import java.util.Map;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonFactory;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonParser;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonToken;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * Parses one spool line ONCE (Jackson streaming parser) and returns the requested fields as
 * strings, so the job's SQL needs one parse per line instead of one JSON_VALUE per field.
 *
 * <p>{@code JSON_FIELDS(line, spec)}: spec is {@code name:type,...} with type {@code s} string,
 * {@code i} integer, {@code n} number, {@code v} integer that must not be an explicit null (the
 * schema version); {@code parent.child} names a field of a nested object (one level). The result
 * has one element per spec entry plus a last "flag" element: null when every present field has the
 * right JSON type, otherwise the first problem ({@code type:<field>} or {@code unknown:<field>}).
 * Type strictness mirrors llmsla/events.py: integers reject strings, booleans and non-integral
 * numbers (an integral float such as 5.0 is accepted as 5); numbers reject strings and booleans;
 * strings reject everything else; any unknown field and any repeated name is flagged (Python
 * would keep the last value, the watermark's JSON_LONG sees the first). A line that is not one JSON
 * object (unparseable, an array, trailing garbage) gives null. Absent fields and JSON nulls are
 * null elements: the SQL validity predicates decide about them, and Python names the reason.
 */
public class JsonFields extends ScalarFunction {
    private static final JsonFactory FACTORY = new JsonFactory();
    private static final double LONG_LIMIT = 9.223372036854775807E18;

    private String cachedSpec;
    private Spec spec;
    /** Slots already filled in the current line (bit per slot): a repeated name is flagged. */
    private long seen;

    /** Parsed spec: top-level name -> slot (>= 0) or nested object (PARENT). */
    private static final class Spec {
        final int size;
        final Map<String, Integer> top = new HashMap<>();
        final Map<String, Character> topType = new HashMap<>();
        final Map<String, Map<String, Integer>> nested = new HashMap<>();
        final Map<String, Map<String, Character>> nestedType = new HashMap<>();

        Spec(String text) {
            String[] parts = text.split(",");
            size = parts.length;
            if (size > 63) {
                throw new IllegalArgumentException("JSON_FIELDS supports at most 63 fields");
            }
            for (int i = 0; i < parts.length; i++) {
                String p = parts[i].trim();
                int colon = p.lastIndexOf(':');
                String name = p.substring(0, colon);
                char type = p.charAt(colon + 1);
                int dot = name.indexOf('.');
                if (dot < 0) {
                    top.put(name, i);
                    topType.put(name, type);
                } else {
                    String parent = name.substring(0, dot);
                    String child = name.substring(dot + 1);
                    nested.computeIfAbsent(parent, k -> new HashMap<>()).put(child, i);
                    nestedType.computeIfAbsent(parent, k -> new HashMap<>()).put(child, type);
                }
            }
        }
    }

    public String[] eval(String line, String specText) {
        if (line == null || specText == null) {
            return null;
        }
        if (!specText.equals(cachedSpec)) {
            spec = new Spec(specText);
            cachedSpec = specText;
        }
        String[] out = new String[spec.size + 1];
        seen = 0L;
        try (JsonParser p = FACTORY.createParser(line)) {
            if (p.nextToken() != JsonToken.START_OBJECT) {
                return null;
            }
            if (!readObject(p, spec.top, spec.topType, true, "", out)) {
                return out; // flagged: rejected whatever follows; Python names the reason
            }
            if (p.nextToken() != null) {
                return null; // trailing content after the object
            }
        } catch (IOException | RuntimeException e) {
            return null;
        }
        return out;
    }

    /** Reads the fields of the current object into out; false (with the flag set) on a problem. */
    private boolean readObject(JsonParser p, Map<String, Integer> slots, Map<String, Character> types,
                               boolean top, String prefix, String[] out) throws IOException {
        JsonToken t;
        while ((t = p.nextToken()) == JsonToken.FIELD_NAME) {
            String name = p.currentName();
            JsonToken value = p.nextToken();
            Integer slot = slots.get(name);
            if (slot != null) {
                if ((seen & (1L << slot)) != 0) {
                    // Python keeps the last, the watermark's JSON_LONG the first: refuse to guess
                    return flag(out, "duplicate:" + prefix + name, p);
                }
                seen |= 1L << slot;
                String problem = convert(p, value, types.get(name), out, slot);
                if (problem != null) {
                    return flag(out, problem + ":" + prefix + name, p);
                }
                continue;
            }
            Map<String, Integer> childSlots = top ? spec.nested.get(name) : null;
            if (childSlots == null) {
                return flag(out, "unknown:" + prefix + name, p);
            }
            if (value == JsonToken.VALUE_NULL) {
                continue; // children stay null; the validity predicates reject that
            }
            if (value != JsonToken.START_OBJECT) {
                return flag(out, "type:" + name, p);
            }
            if (!readObject(p, childSlots, spec.nestedType.get(name), false, name + ".", out)) {
                return false;
            }
        }
        if (t != JsonToken.END_OBJECT) {
            throw new IOException("malformed object");
        }
        return true;
    }

    /** Records the first problem; the line is rejected whatever follows, so parsing stops. */
    private static boolean flag(String[] out, String problem, JsonParser p) {
        out[out.length - 1] = problem;
        return false;
    }

    /** Stores one value; returns null when it has the declared type, else "type". */
    private static String convert(JsonParser p, JsonToken t, char type, String[] out, int slot)
            throws IOException {
        if (t == JsonToken.VALUE_NULL) {
            return type == 'v' ? "type" : null;
        }
        switch (type) {
            case 's':
                if (t != JsonToken.VALUE_STRING) {
                    return skip(p, t);
                }
                out[slot] = p.getText();
                return null;
            case 'n':
                if (t != JsonToken.VALUE_NUMBER_INT && t != JsonToken.VALUE_NUMBER_FLOAT) {
                    return skip(p, t);
                }
                out[slot] = p.getText();
                return null;
            default: // 'i', 'v'
                if (t == JsonToken.VALUE_NUMBER_INT) {
                    JsonParser.NumberType nt = p.getNumberType();
                    if (nt == JsonParser.NumberType.BIG_INTEGER) {
                        return "type";
                    }
                    out[slot] = Long.toString(p.getLongValue());
                    return null;
                }
                if (t == JsonToken.VALUE_NUMBER_FLOAT) {
                    double d = p.getDoubleValue();
                    if (Double.isFinite(d) && d == Math.rint(d) && Math.abs(d) < LONG_LIMIT) {
                        out[slot] = Long.toString((long) d);
                        return null;
                    }
                }
                return skip(p, t);
        }
    }

    private static String skip(JsonParser p, JsonToken t) throws IOException {
        if (t == JsonToken.START_OBJECT || t == JsonToken.START_ARRAY) {
            p.skipChildren();
        }
        return "type";
    }
}
