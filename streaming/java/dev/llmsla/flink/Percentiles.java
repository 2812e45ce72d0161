package dev.llmsla.flink;

import java.util.Arrays;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;

/**
 * Exact percentiles of a window's values, by the definition of Flink's built-in {@code PERCENTILE}
 * (and numpy's default, PostgreSQL's {@code percentile_cont}): linear interpolation at rank
 * {@code p * (n - 1)} of the sorted non-null values; null when there are none. Returns
 * {@code ARRAY<DOUBLE>}, one element per percentile given to the constructor: the job registers
 * one instance per percentile set (e.g. {@code LLMSLA_P50_P95_P99(ttft_ms)}), so the percentiles
 * are not arguments copied into every buffered row.
 *
 * <p>Why not {@code PERCENTILE}: its accumulator is a map of boxed value to count, and merging the
 * local and global window phases rebuilds those maps; in the job's profile that was about a fifth
 * of all CPU. Here values are appended to a {@code double[]} and sorted once, when the window fires.
 */
@FunctionHint(output = @DataTypeHint("ARRAY<DOUBLE>"))
public class Percentiles extends AggregateFunction<Double[], Percentiles.Acc> {
    private static final long serialVersionUID = 1L;

    private final double[] ps;

    public Percentiles(double... ps) {
        if (ps.length == 0) {
            throw new IllegalArgumentException("Percentiles: no percentile given");
        }
        for (double p : ps) {
            if (!(p >= 0 && p <= 1)) {
                throw new IllegalArgumentException("Percentiles: " + p + " is not in [0, 1]");
            }
        }
        this.ps = ps.clone();
    }

    /** The values seen: the first {@code n} of {@code values}. */
    public static class Acc {
        public double[] values = new double[16];
        public int n;
    }

    @Override
    public Acc createAccumulator() {
        return new Acc();
    }

    public void accumulate(Acc acc, Double x) {
        if (x == null) {
            return;
        }
        if (acc.n == acc.values.length) {
            acc.values = Arrays.copyOf(acc.values, acc.n * 2);
        }
        acc.values[acc.n++] = x;
    }

    public void merge(Acc acc, Iterable<Acc> others) {
        for (Acc o : others) {
            if (acc.values.length < acc.n + o.n) {
                acc.values = Arrays.copyOf(acc.values, Math.max(acc.n + o.n, acc.values.length * 2));
            }
            System.arraycopy(o.values, 0, acc.values, acc.n, o.n);
            acc.n += o.n;
        }
    }

    @Override
    public Double[] getValue(Acc acc) {
        if (acc.n == 0) {
            return null;
        }
        double[] sorted = Arrays.copyOf(acc.values, acc.n);
        Arrays.sort(sorted);
        Double[] out = new Double[ps.length];
        for (int i = 0; i < out.length; i++) {
            double pos = ps[i] * (acc.n - 1);
            int lo = (int) Math.floor(pos);
            int hi = (int) Math.ceil(pos);
            out[i] = sorted[lo] + (pos - lo) * (sorted[hi] - sorted[lo]);
        }
        return out;
    }
}
