package dev.llmsla.flink;

import java.util.function.IntToLongFunction;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;

/**
 * A window's latency histogram on the store's one fixed log-spaced layout ({@code names.HIST_*}):
 * counts per bucket, returned as the PostgreSQL array text the store's {@code ttft_hist} /
 * {@code e2e_hist} columns hold, subscripts = bucket indices: {@code [312:315]={4,0,1,7}} (only
 * the range between the smallest and the largest value); null when there is no value.
 *
 * <p>The bucket bounds are the constructor's argument: the job registers one instance with
 * {@code names.HIST_BOUNDS_MS}, so the layout is defined once. Bucket {@code i} holds
 * {@code bounds[i-1] < x <= bounds[i]} (bucket 0: {@code x <= bounds[0]}; the last: above the last
 * bound), the ties of {@code llmsla.histogram.bucket_index} (Python's {@code bisect_left}), found
 * by the same comparisons on the same doubles, so the JVM and Python agree on every value.
 */
@FunctionHint(output = @DataTypeHint("STRING"))
public class Histogram extends AggregateFunction<String, Histogram.Acc> {
    private static final long serialVersionUID = 1L;

    private final double[] bounds;

    public Histogram(double... bounds) {
        if (bounds.length == 0) {
            throw new IllegalArgumentException("Histogram: no bucket bound given");
        }
        for (int i = 1; i < bounds.length; i++) {
            if (!(bounds[i] > bounds[i - 1])) {
                throw new IllegalArgumentException("Histogram: bounds must increase (at " + i + ")");
            }
        }
        this.bounds = bounds.clone();
    }

    /** Counts of buckets {@code lo .. hi} in {@code counts} (length: every bucket); empty when hi < lo. */
    public static class Acc {
        public int[] counts;
        public int lo = Integer.MAX_VALUE;
        public int hi = -1;
    }

    @Override
    public Acc createAccumulator() {
        return new Acc();
    }

    /** First {@code i} with {@code x <= bounds[i]} ({@code bounds.length} when above them all). */
    int bucket(double x) {
        int lo = 0;
        int hi = bounds.length;
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (bounds[mid] < x) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo;
    }

    private void add(Acc acc, int b, int count) {
        if (acc.counts == null) {
            acc.counts = new int[bounds.length + 1];
        }
        acc.counts[b] += count;
        if (b < acc.lo) {
            acc.lo = b;
        }
        if (b > acc.hi) {
            acc.hi = b;
        }
    }

    public void accumulate(Acc acc, Double x) {
        if (x == null || x.isNaN()) {
            return;
        }
        add(acc, bucket(x), 1);
    }

    public void merge(Acc acc, Iterable<Acc> others) {
        for (Acc o : others) {
            for (int b = o.lo; b <= o.hi; b++) {
                if (o.counts[b] != 0) {
                    add(acc, b, o.counts[b]);
                }
            }
        }
    }

    @Override
    public String getValue(Acc acc) {
        return acc.hi < acc.lo ? null : arrayText(acc.lo, acc.hi, b -> acc.counts[b]);
    }

    /** Receives one bucket's count from {@link #forEachCount}. */
    @FunctionalInterface
    interface BucketCount {
        void accept(int bucket, long count);
    }

    /**
     * Each non-zero count of a histogram in the store's array text ({@code [312:315]={4,0,1,7}}),
     * with its bucket index; nothing for null. A text without subscripts ({@code {1,2}}) starts at
     * 1, as PostgreSQL reads it.
     */
    static void forEachCount(String text, BucketCount out) {
        if (text == null) {
            return;
        }
        int n = text.length();
        int i;
        int bucket = 1;
        if (n > 0 && text.charAt(0) == '[') {
            int colon = text.indexOf(':');
            if (colon < 0) {
                throw new IllegalArgumentException("histogram: no ':' in " + text);
            }
            bucket = Integer.parseInt(text, 1, colon, 10);
            i = text.indexOf('{', colon);
        } else {
            i = text.indexOf('{');
        }
        if (i < 0 || text.charAt(n - 1) != '}') {
            throw new IllegalArgumentException("histogram: not an array text: " + text);
        }
        i++;
        while (i < n - 1) {
            int end = text.indexOf(',', i);
            if (end < 0) {
                end = n - 1;
            }
            long count = Long.parseLong(text, i, end, 10);
            if (count != 0) {
                out.accept(bucket, count);
            }
            bucket++;
            i = end + 1;
        }
    }

    /** The PostgreSQL array text of buckets {@code lo .. hi} (subscripts = bucket indices). */
    static String arrayText(int lo, int hi, IntToLongFunction count) {
        StringBuilder sb = new StringBuilder(16 + 4 * (hi - lo + 1));
        sb.append('[').append(lo).append(':').append(hi).append("]={");
        for (int b = lo; b <= hi; b++) {
            if (b > lo) {
                sb.append(',');
            }
            sb.append(count.applyAsLong(b));
        }
        return sb.append('}').toString();
    }
}
