package dev.llmsla.flink;

import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.PriorityQueue;

/**
 * A spool reader's event-time frontier: per writer, the highest event time it produced (within the
 * trusted range, like the SQL watermark's CASE), per unread segment its start, and whether each
 * writer is still active.
 *
 * <p>{@link #bound} = min( min over active writers of their highest event time, min over segments
 * not yet started of their start ); the reader's watermark is that minus the delay. A writer is
 * active while it has unread segments or produced data within the idle timeout (processing time);
 * a segment named unlike a SpoolWriter's is a writer of its own, done as soon as it is read.
 * So a backlog never makes anything late (an unread segment holds the watermark at its start), a
 * writer whose clock runs ahead only delays its own windows, and a writer that went quiet stops
 * holding the others back after the idle timeout.
 *
 * <p>Task thread only. {@link #onRecord} is on the per-record path: a few comparisons; it marks the
 * frontier {@link #dirty} only when the writer advanced by more than the watermark interval since
 * the last look, so the bound is recomputed about once per interval of each writer's event time
 * (the SQL watermark operator's eager emission does the same).
 */
final class EventTimeTracker {
    static final class Writer {
        final String name;
        long maxTs = Long.MIN_VALUE;
        /** Start of its segment being read while no event time is known from it (MIN: unknown). */
        long floor = Long.MAX_VALUE;
        int unread;
        long lastActiveNanos;
        boolean touched;
        long lookedAt = Long.MIN_VALUE;
        /** A segment named unlike a SpoolWriter's is a writer of its own: done once it is read. */
        boolean single;

        Writer(String name) {
            this.name = name;
        }
    }

    /** The reader's state of one segment (SourceReaderBase's split state). */
    static final class FileState {
        final SpoolSplit split;
        final Writer writer;
        long offset;
        boolean started;

        FileState(SpoolSplit split, Writer writer) {
            this.split = split;
            this.writer = writer;
            this.offset = split.offset();
        }
    }

    private final long intervalMillis;
    private final long idleNanos;
    private final long maxPastMillis;
    private final long maxFutureMillis;
    private final Map<String, Writer> writers = new HashMap<>();
    private final Map<String, FileState> unread = new HashMap<>();
    /** Unread segments not yet started, lowest start first; started/finished ones leave lazily. */
    private final PriorityQueue<FileState> waiting = new PriorityQueue<>((a, b) -> Long.compare(a.split.start(), b.split.start()));
    private long lo = Long.MIN_VALUE;
    private long hi = Long.MAX_VALUE;
    boolean dirty = true;

    EventTimeTracker(long intervalMillis, long idleMillis, long maxPastMillis, long maxFutureMillis) {
        this.intervalMillis = intervalMillis;
        this.idleNanos = idleMillis * 1_000_000L;
        this.maxPastMillis = maxPastMillis;
        this.maxFutureMillis = maxFutureMillis;
        refresh(System.currentTimeMillis()); // a first line stamped next year must not count either
    }

    private Writer writer(String name, long nanos) {
        Writer w = writers.computeIfAbsent(name, Writer::new);
        w.lastActiveNanos = nanos;
        return w;
    }

    FileState add(SpoolSplit split, long nanos) {
        Writer w = writer(split.writer(), nanos);
        w.single = split.writer().equals(java.nio.file.Paths.get(split.path()).getFileName().toString());
        w.unread++;
        FileState f = new FileState(split, w);
        unread.put(split.splitId(), f);
        waiting.add(f);
        dirty = true;
        return f;
    }

    void finished(String splitId, long nanos) {
        FileState f = unread.remove(splitId);
        if (f != null) {
            if (f.started) {
                f.writer.floor = Long.MAX_VALUE;
            }
            f.started = true; // done: leaves `waiting` on the next look
            f.writer.unread--;
            f.writer.lastActiveNanos = nanos;
            dirty = true;
        }
    }

    /** A restored writer table: active again (for one idle timeout) at its checkpointed progress. */
    void restore(Map<String, Long> table, long nanos) {
        for (Map.Entry<String, Long> e : table.entrySet()) {
            Writer w = writer(e.getKey(), nanos);
            w.maxTs = Math.max(w.maxTs, e.getValue());
        }
        dirty = true;
    }

    /** The active writers' progress, for the reader's checkpoint. */
    Map<String, Long> activeWriters(long nanos) {
        Map<String, Long> out = new LinkedHashMap<>();
        for (Writer w : writers.values()) {
            boolean done = w.single && w.unread == 0;
            if (!done && w.maxTs != Long.MIN_VALUE && (w.unread > 0 || w.touched || nanos - w.lastActiveNanos < idleNanos)) {
                out.put(w.name, w.maxTs);
            }
        }
        return out;
    }

    /** Per record, after it was emitted. */
    void onRecord(FileState f, long ts) {
        Writer w = f.writer;
        if (!f.started) {
            f.started = true;
            if (w.maxTs == Long.MIN_VALUE) {
                w.floor = Math.min(w.floor, f.split.start());
            }
            dirty = true;
        }
        w.touched = true;
        if (ts > w.maxTs && ts >= lo && ts <= hi) {
            w.maxTs = ts;
            if (w.lookedAt == Long.MIN_VALUE || ts - w.lookedAt > intervalMillis) {
                w.lookedAt = ts;
                dirty = true;
            }
        }
    }

    /** The range of event times trusted for the frontier: [now - max past, now + max future]. */
    void refresh(long nowMillis) {
        lo = nowMillis - maxPastMillis;
        hi = nowMillis + maxFutureMillis;
    }

    /** The frontier; {@link Long#MAX_VALUE} when nothing is active (the reader then follows others). */
    long bound(long nanos) {
        while (!waiting.isEmpty() && waiting.peek().started) {
            waiting.poll(); // O(1) amortised: a backlog of thousands of segments is read in order of start
        }
        long b = waiting.isEmpty() ? Long.MAX_VALUE : waiting.peek().split.start();
        Iterator<Writer> it = writers.values().iterator();
        while (it.hasNext()) {
            Writer w = it.next();
            if (w.touched) {
                w.lastActiveNanos = nanos;
                w.touched = false;
            }
            if (w.unread == 0 && (w.single || nanos - w.lastActiveNanos >= idleNanos)) {
                it.remove(); // quiet, or a one-segment writer: holds nobody back (a new segment re-adds it)
                continue;
            }
            b = Math.min(b, w.maxTs != Long.MIN_VALUE ? w.maxTs : w.floor);
        }
        return b;
    }
}
