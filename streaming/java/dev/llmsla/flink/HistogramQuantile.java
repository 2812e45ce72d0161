package dev.llmsla.flink;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * Quantile {@code q} of a histogram in the store's array text ({@link Histogram}'s and
 * {@link HistogramSum}'s output): the job gives its 1-minute roll-up rows their quantile columns
 * itself, so the store does not compute them in PL/pgSQL for every minute row (about 40 % of the
 * database's time for those rows, docs/streaming.md).
 *
 * <p>The definition of {@code llmsla.histogram.quantile} and of the store's
 * {@code llmsla_hist_quantile}: the value of the bucket holding the {@code k}-th smallest count,
 * {@code k = max(1, ceil(q * n))}, computed with the same doubles; null for a null or empty
 * histogram. The bucket values are the constructor's argument ({@code names.HIST_VALUES_MS}),
 * so the layout is defined once, in Python.
 */
@FunctionHint(output = @DataTypeHint("DOUBLE"))
public class HistogramQuantile extends ScalarFunction {
    private static final long serialVersionUID = 1L;

    private final double[] values;

    public HistogramQuantile(double... values) {
        if (values.length == 0) {
            throw new IllegalArgumentException("HistogramQuantile: no bucket value given");
        }
        this.values = values.clone();
    }

    public Double eval(String text, Double q) {
        if (text == null || q == null) {
            return null;
        }
        if (!(q >= 0.0 && q <= 1.0)) {
            throw new IllegalArgumentException("HistogramQuantile: q must be in [0, 1], got " + q);
        }
        long[] n = {0};
        Histogram.forEachCount(text, (bucket, count) -> n[0] += count);
        if (n[0] == 0) {
            return null;
        }
        double k = Math.max(1.0, Math.ceil(q * (double) n[0]));
        long[] seen = {0};
        int[] found = {-1};
        Histogram.forEachCount(text, (bucket, count) -> {
            if (found[0] < 0) {
                seen[0] += count;
                if ((double) seen[0] >= k) {
                    found[0] = bucket;
                }
            }
        });
        if (found[0] < 0 || found[0] >= values.length) {
            throw new IllegalArgumentException("HistogramQuantile: bucket " + found[0] + " outside the layout 0.."
                                               + (values.length - 1));
        }
        return values[found[0]];
    }
}
