package dev.llmsla.flink;

import java.util.Base64;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * Base64 of a BYTES value, byte for byte. A dead letter keeps its line exactly as read, invalid
 * UTF-8 included: {@code TO_BASE64(CAST(line AS STRING))} would decode the bytes as UTF-8 first
 * and replace what is invalid. Null in, null out.
 */
public class Base64Bytes extends ScalarFunction {
    private static final long serialVersionUID = 1L;

    public @DataTypeHint("STRING") String eval(byte[] bytes) {
        return bytes == null ? null : Base64.getEncoder().encodeToString(bytes);
    }
}
