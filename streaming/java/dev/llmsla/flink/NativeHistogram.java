package dev.llmsla.flink;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * The increase of an engine's own latency histogram between two samples of one replica, on the
 * store's fixed layout: {@code LLMSLA_NATIVE_HIST_DELTA(buckets, prev_buckets, counter_reset)}
 * returns the array text {@link Histogram} writes ({@code [312:315]={4,0,1,7}}), which
 * {@link HistogramSum} adds up per window (engine_windows.engine_ttft_hist, docs/engines.md).
 *
 * <p>{@code buckets} is a sample's histogram as the llmsla-json format encodes it ({@link #encode}:
 * bounds in seconds, cumulative counts, total count). The increase is reset-safe like the job's
 * counters: null for a replica's first sample (no previous one); the sample's own counts where
 * {@code counter_reset} is 1, any bucket went down or the bounds changed (a restarted engine);
 * otherwise the per-bucket difference.
 *
 * <p>Each engine has its own bounds, so its buckets are spread onto the layout: the {@code c}
 * observations of native bucket {@code (lo, hi]} are placed at {@code lo + (hi - lo) * (k + 0.5) / c},
 * {@code k = 0 .. c-1} (uniform inside the bucket, the linear interpolation Prometheus'
 * {@code histogram_quantile} assumes; the first bucket starts at 0), and those of the +Inf bucket
 * at the highest finite bound (where {@code histogram_quantile} puts them). A quantile of the result
 * is then within the layout's 1 % of that interpolation. The layout's bounds are the constructor's
 * argument ({@code names.HIST_BOUNDS_MS}), as for {@link Histogram}.
 */
@FunctionHint(output = @DataTypeHint("STRING"))
public class NativeHistogram extends ScalarFunction {
    private static final long serialVersionUID = 1L;

    private final Histogram layout;
    private final int size;

    public NativeHistogram(double... bounds) {
        this.layout = new Histogram(bounds);
        this.size = bounds.length + 1;
    }

    /** {@code le1,le2,...;c1,c2,...;count}: bounds (seconds, exact round trip) and cumulative counts. */
    static String encode(double[] le, long[] counts, long count) {
        StringBuilder sb = new StringBuilder(24 * le.length + 8);
        for (int i = 0; i < le.length; i++) {
            sb.append(i > 0 ? "," : "").append(le[i]);
        }
        sb.append(';');
        for (int i = 0; i < counts.length; i++) {
            sb.append(i > 0 ? "," : "").append(counts[i]);
        }
        return sb.append(';').append(count).toString();
    }

    /** A decoded sample: bounds and per-bucket counts, the last one the +Inf bucket's. */
    private static final class Native {
        final double[] le;
        final long[] perBucket;

        Native(String text) {
            String[] parts = text.split(";", -1);
            if (parts.length != 3) {
                throw new IllegalArgumentException("native histogram: not le;counts;count: " + text);
            }
            String[] les = parts[0].isEmpty() ? new String[0] : parts[0].split(",");
            String[] cums = parts[1].isEmpty() ? new String[0] : parts[1].split(",");
            le = new double[les.length];
            perBucket = new long[les.length + 1];
            long previous = 0;
            for (int i = 0; i < les.length; i++) {
                le[i] = Double.parseDouble(les[i]);
                long cumulative = Long.parseLong(cums[i]);
                perBucket[i] = cumulative - previous;
                previous = cumulative;
            }
            perBucket[les.length] = Long.parseLong(parts[2]) - previous;
        }
    }

    public String eval(String buckets, String previous, Integer counterReset) {
        if (buckets == null || previous == null) {
            return null;
        }
        Native cur = new Native(buckets);
        Native prev = new Native(previous);
        long[] delta = cur.perBucket.clone();
        boolean restarted = (counterReset != null && counterReset == 1) || !java.util.Arrays.equals(cur.le, prev.le);
        if (!restarted) {
            for (int i = 0; i < delta.length; i++) {
                delta[i] -= prev.perBucket[i];
                if (delta[i] < 0) { // a bucket went down: the engine restarted between the samples
                    return spread(cur.le, cur.perBucket);
                }
            }
        }
        return spread(cur.le, delta);
    }

    /** Place each native bucket's observations on the layout (see the class comment). */
    private String spread(double[] le, long[] perBucket) {
        if (le.length == 0) {
            return null; // only a total count: nothing says where the observations fell
        }
        long[] counts = new long[size];
        int lo = Integer.MAX_VALUE;
        int hi = -1;
        for (int j = 0; j < perBucket.length; j++) {
            long c = perBucket[j];
            if (c <= 0) {
                continue;
            }
            if (j == le.length) { // +Inf: at the highest finite bound
                int b = layout.bucket(le[j - 1] * 1000.0);
                counts[b] += c;
                lo = Math.min(lo, b);
                hi = Math.max(hi, b);
                continue;
            }
            double from = j == 0 ? 0.0 : le[j - 1] * 1000.0;
            double to = le[j] * 1000.0;
            for (long k = 0; k < c; k++) {
                int b = layout.bucket(from + (to - from) * (k + 0.5) / c);
                counts[b]++;
                lo = Math.min(lo, b);
                hi = Math.max(hi, b);
            }
        }
        return hi < 0 ? null : Histogram.arrayText(lo, hi, b -> counts[b]);
    }
}
