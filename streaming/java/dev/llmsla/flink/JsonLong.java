package dev.llmsla.flink;

import java.io.IOException;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonFactory;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonParser;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonToken;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * {@code JSON_LONG(line, field)}: one top-level integer field, for the source's event-time column.
 * Stops at the field (ts_ms is the second key of every producer's line), so it costs a fraction
 * of a full parse; null when absent, not an integer, or the line is not a JSON object. Whether the
 * line is otherwise valid is decided later by JSON_FIELDS and the SQL checks.
 */
public class JsonLong extends ScalarFunction {
    private static final JsonFactory FACTORY = new JsonFactory();

    public Long eval(String line, String field) {
        if (line == null || field == null) {
            return null;
        }
        try (JsonParser p = FACTORY.createParser(line)) {
            if (p.nextToken() != JsonToken.START_OBJECT) {
                return null;
            }
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                String name = p.currentName();
                JsonToken v = p.nextToken();
                if (field.equals(name)) {
                    if (v == JsonToken.VALUE_NUMBER_INT
                            && p.getNumberType() != JsonParser.NumberType.BIG_INTEGER) {
                        return p.getLongValue();
                    }
                    if (v == JsonToken.VALUE_NUMBER_FLOAT) {
                        double d = p.getDoubleValue();
                        if (Double.isFinite(d) && d == Math.rint(d) && Math.abs(d) < 9.2e18) {
                            return (long) d;
                        }
                    }
                    return null;
                }
                p.skipChildren();
            }
        } catch (IOException | RuntimeException e) {
            return null;
        }
        return null;
    }
}
