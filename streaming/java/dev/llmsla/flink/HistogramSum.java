package dev.llmsla.flink;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;

/**
 * The sum of histograms in the store's array text ({@link Histogram}'s output,
 * {@code [312:315]={4,0,1,7}}), in the same text: the job's 1-minute roll-up rows sum their 5 s
 * windows' histograms with it on the JVM, so the store does not add them one by one in PL/pgSQL
 * (docs/streaming.md). Counts are longs (a roll-up column is {@code bigint[]}); a null or empty
 * input adds nothing; the sum of none is null. A text without subscripts ({@code {1,2}}) starts
 * at 1, as PostgreSQL reads it.
 */
@FunctionHint(output = @DataTypeHint("STRING"))
public class HistogramSum extends AggregateFunction<String, HistogramSum.Acc> {
    private static final long serialVersionUID = 1L;

    /** Counts of buckets {@code lo .. hi}, stored from {@code counts[0]} = bucket {@code lo}. */
    public static class Acc {
        public long[] counts = new long[0];
        public int lo = 0;
        public int hi = -1;
    }

    @Override
    public Acc createAccumulator() {
        return new Acc();
    }

    private static void add(Acc acc, int bucket, long count) {
        if (acc.hi < acc.lo) {
            acc.counts = new long[16];
            acc.lo = bucket;
            acc.hi = bucket;
        } else if (bucket < acc.lo || bucket > acc.hi) {
            int lo = Math.min(acc.lo, bucket);
            int hi = Math.max(acc.hi, bucket);
            if (acc.lo != lo || hi - lo + 1 > acc.counts.length) {
                long[] grown = new long[Math.max(hi - lo + 1, 2 * acc.counts.length)];
                System.arraycopy(acc.counts, 0, grown, acc.lo - lo, acc.hi - acc.lo + 1);
                acc.counts = grown;
            }
            acc.lo = lo;
            acc.hi = hi;
        }
        acc.counts[bucket - acc.lo] += count;
    }

    public void accumulate(Acc acc, String text) {
        Histogram.forEachCount(text, (bucket, count) -> add(acc, bucket, count));
    }

    public void merge(Acc acc, Iterable<Acc> others) {
        for (Acc o : others) {
            for (int b = o.lo; b <= o.hi; b++) {
                if (o.counts[b - o.lo] != 0) {
                    add(acc, b, o.counts[b - o.lo]);
                }
            }
        }
    }

    @Override
    public String getValue(Acc acc) {
        return acc.hi < acc.lo ? null : Histogram.arrayText(acc.lo, acc.hi, b -> acc.counts[b - acc.lo]);
    }
}
