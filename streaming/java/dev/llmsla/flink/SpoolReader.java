package dev.llmsla.flink;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.apache.flink.api.common.eventtime.Watermark;
import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.connector.source.ReaderOutput;
import org.apache.flink.api.connector.source.SourceEvent;
import org.apache.flink.api.connector.source.SourceOutput;
import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.connector.base.source.reader.RecordEmitter;
import org.apache.flink.connector.base.source.reader.SingleThreadMultiplexSourceReaderBase;
import org.apache.flink.connector.base.source.reader.fetcher.SingleThreadFetcherManager;
import org.apache.flink.core.io.InputStatus;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.table.data.RowData;
import org.apache.flink.util.UserCodeClassLoader;

/**
 * A spool reader: the fetcher thread reads and parses its segments in order of start
 * ({@link SpoolSplitReader}); the task thread emits the rows and the watermark of
 * {@link EventTimeTracker}: bound - delay, monotone, emitted when it moves.
 *
 * <p>Why never idle: a reader with no active writer does not mark itself idle; it follows the lowest
 * watermark of the active readers (relayed by the enumerator). Flink drops an idle input from the
 * downstream watermark and, when it comes back, lets its records through while the downstream
 * watermark is already ahead of the reader's own: the job's late check (which reads the reader's
 * watermark, before the shuffle) would then pass records that the window operator (after it)
 * silently drops. Following keeps every reader's watermark at or above the downstream one, so the
 * check stays exact at any parallelism.
 *
 * <p>Checkpoint: the unfinished segments with their byte offset, plus the table of active writers,
 * so that after a restore a writer whose next segment was not yet published still holds the
 * watermark (for one idle timeout); and no watermark leaves MIN before the first directory scan of
 * the (restored) job was assigned.
 */
final class SpoolReader extends SingleThreadMultiplexSourceReaderBase<
        SpoolSplitReader.Batch, RowData, SpoolSplit, EventTimeTracker.FileState> {
    private final SingleThreadFetcherManager<SpoolSplitReader.Batch, SpoolSplit> fetchers;
    private final EventTimeTracker tracker;
    private final boolean watermarks;
    private final long delayMillis;
    private final long intervalMillis;
    private final boolean relay;
    private ScheduledExecutorService ticker;
    private volatile boolean tick;
    private boolean holding = true;
    private long emitted = Long.MIN_VALUE;
    private long followed = Long.MIN_VALUE;
    private long reportedWatermark = Long.MIN_VALUE;
    private boolean reportedActive;
    private long reportedAt;

    static SpoolReader create(SourceReaderContext context, SpoolSource source) throws Exception {
        DeserializationSchema<RowData> format = source.format();
        format.open(new DeserializationSchema.InitializationContext() {
            @Override
            public MetricGroup getMetricGroup() {
                return context.metricGroup();
            }

            @Override
            public UserCodeClassLoader getUserCodeClassLoader() {
                return context.getUserCodeClassLoader();
            }
        });
        EventTimeTracker tracker = new EventTimeTracker(source.intervalMillis(), source.idleMillis(),
                source.maxPastMillis(), source.maxFutureMillis());
        SingleThreadFetcherManager<SpoolSplitReader.Batch, SpoolSplit> fetchers = new SingleThreadFetcherManager<>(
                () -> new SpoolSplitReader(format, source.withPath()), context.getConfiguration());
        return new SpoolReader(fetchers, new Emitter(tracker, source.timeIndex()), tracker, context, source);
    }

    private SpoolReader(SingleThreadFetcherManager<SpoolSplitReader.Batch, SpoolSplit> fetchers, Emitter emitter,
                        EventTimeTracker tracker, SourceReaderContext context, SpoolSource source) {
        super(fetchers, emitter, context.getConfiguration(), context);
        this.fetchers = fetchers;
        this.tracker = tracker;
        this.watermarks = source.emitsWatermarks();
        this.delayMillis = source.delayMillis();
        this.intervalMillis = Math.max(1, source.intervalMillis());
        this.relay = context.currentParallelism() > 1;
        this.reportedAt = System.nanoTime() - intervalMillis * 1_000_000L; // the first report goes at once
    }

    @Override
    public void start() {
        super.start();
        if (watermarks) {
            ticker = Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "llmsla-spool-watermark-" + context.getIndexOfSubtask());
                t.setDaemon(true);
                return t;
            });
            ticker.scheduleAtFixedRate(this::wake, intervalMillis, intervalMillis, TimeUnit.MILLISECONDS);
        }
    }

    /** Any thread: have the task thread look at the watermark soon, even with no data. */
    private void wake() {
        tick = true;
        fetchers.getQueue().notifyAvailable();
    }

    @Override
    public InputStatus pollNext(ReaderOutput<RowData> output) throws Exception {
        InputStatus status = super.pollNext(output);
        if (watermarks && (tick || tracker.dirty || status != InputStatus.MORE_AVAILABLE)) {
            advance(output);
        }
        return status;
    }

    private void advance(ReaderOutput<RowData> output) {
        tick = false;
        tracker.dirty = false;
        long nanos = System.nanoTime();
        tracker.refresh(System.currentTimeMillis());
        long bound = tracker.bound(nanos);
        boolean active = bound != Long.MAX_VALUE;
        long watermark = !active ? followed : bound == Long.MIN_VALUE ? Long.MIN_VALUE : bound - delayMillis;
        if (!holding && watermark > emitted) {
            emitted = watermark;
            output.emitWatermark(new Watermark(watermark));
        }
        if (relay && (active != reportedActive || emitted != reportedWatermark)
                && nanos - reportedAt >= intervalMillis * 1_000_000L) {
            reportedActive = active;
            reportedWatermark = emitted;
            reportedAt = nanos;
            context.sendSourceEventToCoordinator(new SpoolEvents.Report(emitted, active));
        }
    }

    @Override
    public void handleSourceEvents(SourceEvent event) {
        if (event instanceof SpoolEvents.ScanDone) {
            holding = false;
            wake();
        } else if (event instanceof SpoolEvents.Hold) {
            holding = true;
        } else if (event instanceof SpoolEvents.Follow) {
            followed = Math.max(followed, ((SpoolEvents.Follow) event).watermark);
            wake();
        } else {
            super.handleSourceEvents(event);
        }
    }

    @Override
    public void addSplits(List<SpoolSplit> splits) {
        List<SpoolSplit> files = new ArrayList<>(splits.size());
        for (SpoolSplit split : splits) {
            if (split.isWriterTable()) {
                tracker.restore(split.writers(), System.nanoTime());
            } else {
                files.add(split);
            }
        }
        if (!files.isEmpty()) {
            super.addSplits(files);
        }
    }

    @Override
    public List<SpoolSplit> snapshotState(long checkpointId) {
        List<SpoolSplit> state = new ArrayList<>(super.snapshotState(checkpointId));
        Map<String, Long> writers = tracker.activeWriters(System.nanoTime());
        if (!writers.isEmpty()) {
            state.add(SpoolSplit.writerTable(context.getIndexOfSubtask(), writers));
        }
        return state;
    }

    @Override
    protected void onSplitFinished(Map<String, EventTimeTracker.FileState> finished) {
        long nanos = System.nanoTime();
        for (String id : finished.keySet()) {
            tracker.finished(id, nanos);
        }
    }

    @Override
    protected EventTimeTracker.FileState initializedState(SpoolSplit split) {
        return tracker.add(split, System.nanoTime());
    }

    @Override
    protected SpoolSplit toSplitType(String splitId, EventTimeTracker.FileState state) {
        return state.split.at(state.offset);
    }

    @Override
    public void close() throws Exception {
        if (ticker != null) {
            ticker.shutdownNow();
        }
        super.close();
    }

    /** Task thread: emits a row with its event time, advances the segment's offset and the frontier. */
    static final class Emitter implements RecordEmitter<SpoolSplitReader.Batch, RowData, EventTimeTracker.FileState> {
        private final EventTimeTracker tracker;
        private final int timeIndex;

        Emitter(EventTimeTracker tracker, int timeIndex) {
            this.tracker = tracker;
            this.timeIndex = timeIndex;
        }

        @Override
        public void emitRecord(SpoolSplitReader.Batch batch, SourceOutput<RowData> output,
                               EventTimeTracker.FileState state) {
            RowData row = batch.row();
            long ts = timeIndex >= 0 && !row.isNullAt(timeIndex)
                    ? row.getTimestamp(timeIndex, 3).getMillisecond() : Long.MIN_VALUE;
            output.collect(row, ts);
            state.offset = batch.end();
            tracker.onRecord(state, ts);
        }
    }
}
