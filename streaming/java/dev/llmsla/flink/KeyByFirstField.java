package dev.llmsla.flink;

import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.types.Row;

/**
 * {@code row -> Row(row[0], row)}: the (key, value) pair PyFlink's {@code key_by} feeds a keyed
 * Python function, computed here instead of in a Python operator.
 *
 * <p>Why: {@code DataStream.key_by(lambda r: r[0])} inserts a Python map for the key, one more
 * operator whose task hands every row to a Python worker and waits for it back (and finishes a
 * bundle there at every checkpoint) before the shuffle to the store sink. The sink's key (the
 * target table) is the first field; taking it on the JVM costs nothing.
 */
public final class KeyByFirstField implements MapFunction<Row, Row> {
    private static final long serialVersionUID = 1L;

    @Override
    public Row map(Row value) {
        return Row.of(value.getField(0), value);
    }
}
