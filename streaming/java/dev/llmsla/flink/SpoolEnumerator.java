package dev.llmsla.flink;

import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.flink.api.connector.source.SourceEvent;
import org.apache.flink.api.connector.source.SplitEnumerator;
import org.apache.flink.api.connector.source.SplitEnumeratorContext;
import org.apache.flink.api.connector.source.SplitsAssignment;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Finds published segments and hands each to the reader of its writer.
 *
 * <p>A scan lists the kind directory (once when bounded, every {@code monitor-interval} otherwise),
 * reads the head of each new segment for its start, and assigns every new segment of that scan in
 * ONE assignment, so a reader learns all segments of a backlog before it picks the next one to read
 * (it reads in order of start). All segments of one writer go to the same reader (hash of the writer
 * modulo parallelism): its watermark then follows each writer's own progress. After the first scan
 * every reader is told so ({@link SpoolEvents.ScanDone}); until then a reader emits no watermark,
 * so a restored reader cannot pass segments published while the job was down.
 *
 * <p>It also relays watermarks: a reader with nothing of its own to read follows the lowest
 * watermark of the readers that have ({@link SpoolEvents.Follow}).
 *
 * <p>State: the segments already assigned (forgotten once deleted, so it stays as small as the
 * directory) and the assigned ones not yet delivered.
 */
final class SpoolEnumerator implements SplitEnumerator<SpoolSplit, SpoolEnumerator.State> {
    private static final Logger LOG = LoggerFactory.getLogger(SpoolEnumerator.class);

    /** Segments per assignment message (each a few hundred bytes; RPC messages are limited). */
    static final int CHUNK = 2000;

    private final SplitEnumeratorContext<SpoolSplit> context;
    private final Path dir;
    private final boolean bounded;
    private final long monitorMillis;
    private final long maxPastMillis;
    private final long maxFutureMillis;
    /** Paths of segments assigned so far (read by the scan thread, changed by the coordinator). */
    private final Set<String> assigned = ConcurrentHashMap.newKeySet();
    /** Assigned segments whose reader has not registered yet, or handed back after a failure. */
    private final List<SpoolSplit> undelivered = new ArrayList<>();
    private final Map<Integer, SpoolEvents.Report> reports = new HashMap<>();
    private final Map<Integer, Long> followed = new HashMap<>();
    private boolean scanned;

    SpoolEnumerator(SplitEnumeratorContext<SpoolSplit> context, Path dir, boolean bounded, long monitorMillis,
                    long maxPastMillis, long maxFutureMillis, State restored) {
        this.context = context;
        this.dir = dir;
        this.bounded = bounded;
        this.monitorMillis = monitorMillis;
        this.maxPastMillis = maxPastMillis;
        this.maxFutureMillis = maxFutureMillis;
        if (restored != null) {
            assigned.addAll(restored.assigned);
            undelivered.addAll(restored.undelivered);
        }
    }

    @Override
    public void start() {
        if (bounded) {
            context.callAsync(this::scan, this::onScan);
        } else {
            context.callAsync(this::scan, this::onScan, 0, monitorMillis);
        }
    }

    /** Scan thread: the listing and the new segments with their start and writer. */
    private Scan scan() throws IOException {
        List<Path> files = SpoolFiles.published(dir);
        long now = System.currentTimeMillis();
        Scan scan = new Scan();
        for (Path file : files) {
            String path = file.toAbsolutePath().toString();
            scan.listed.add(path);
            if (!assigned.contains(path)) {
                String name = file.getFileName().toString();
                long start = SpoolFiles.startOf(file, now - maxPastMillis, now + maxFutureMillis);
                scan.found.add(new SpoolSplit(path, SpoolFiles.writerOf(name), start, 0));
            }
        }
        return scan;
    }

    /** Coordinator thread. */
    private void onScan(Scan scan, Throwable error) {
        if (error != null) {
            throw new RuntimeException("llmsla-spool: cannot scan " + dir, error);
        }
        assigned.retainAll(scan.listed); // forget deleted segments: the state stays bounded
        List<SpoolSplit> fresh = new ArrayList<>();
        for (SpoolSplit split : scan.found) {
            if (assigned.add(split.path())) { // a later scan may have run before this handler
                fresh.add(split);
            }
        }
        fresh.sort(Comparator.comparingLong(SpoolSplit::start).thenComparing(SpoolSplit::path));
        undelivered.addAll(fresh);
        if (!fresh.isEmpty()) {
            LOG.info("llmsla-spool {}: {} new segment(s)", dir, fresh.size());
        }
        deliver();
        if (!scanned) {
            scanned = true;
            for (int reader : context.registeredReaders().keySet()) {
                finishFirstScan(reader);
            }
        }
    }

    private int owner(SpoolSplit split) {
        return Math.floorMod(split.writer().hashCode(), context.currentParallelism());
    }

    /**
     * Everything undelivered whose reader is registered, in one assignment; a long backlog in
     * chunks of {@link #CHUNK} segments (an RPC message has a size limit) between Hold and ScanDone,
     * so no reader moves its watermark before it knows all of them.
     */
    private void deliver() {
        Set<Integer> ready = context.registeredReaders().keySet();
        Map<Integer, List<SpoolSplit>> batch = new HashMap<>();
        List<SpoolSplit> waiting = new ArrayList<>();
        for (SpoolSplit split : undelivered) {
            int reader = owner(split);
            if (ready.contains(reader)) {
                batch.computeIfAbsent(reader, k -> new ArrayList<>()).add(split);
            } else {
                waiting.add(split);
            }
        }
        undelivered.clear();
        undelivered.addAll(waiting);
        for (Map.Entry<Integer, List<SpoolSplit>> e : batch.entrySet()) {
            int reader = e.getKey();
            List<SpoolSplit> splits = e.getValue();
            boolean chunked = splits.size() > CHUNK;
            if (chunked) {
                context.sendEventToSourceReader(reader, new SpoolEvents.Hold());
            }
            for (int from = 0; from < splits.size(); from += CHUNK) {
                Map<Integer, List<SpoolSplit>> chunk = new HashMap<>();
                chunk.put(reader, new ArrayList<>(splits.subList(from, Math.min(splits.size(), from + CHUNK))));
                context.assignSplits(new SplitsAssignment<>(chunk));
            }
            if (chunked && scanned) {
                context.sendEventToSourceReader(reader, new SpoolEvents.ScanDone());
            }
        }
    }

    private void finishFirstScan(int reader) {
        context.sendEventToSourceReader(reader, new SpoolEvents.ScanDone());
        if (bounded) {
            context.signalNoMoreSplits(reader);
        }
    }

    @Override
    public void addReader(int subtaskId) {
        deliver();
        if (scanned) {
            finishFirstScan(subtaskId);
        }
    }

    @Override
    public void addSplitsBack(List<SpoolSplit> splits, int subtaskId) {
        undelivered.addAll(splits); // back to the same reader (same writer hash) when it re-registers
        reports.remove(subtaskId);
        followed.remove(subtaskId);
    }

    @Override
    public void handleSplitRequest(int subtaskId, String requesterHostname) {
        // segments are pushed, never requested
    }

    @Override
    public void handleSourceEvent(int subtaskId, SourceEvent event) {
        if (!(event instanceof SpoolEvents.Report)) {
            return;
        }
        reports.put(subtaskId, (SpoolEvents.Report) event);
        long lowest = Long.MAX_VALUE;
        for (SpoolEvents.Report r : reports.values()) {
            if (r.active) {
                lowest = Math.min(lowest, r.watermark);
            }
        }
        if (lowest == Long.MAX_VALUE) {
            return; // nobody reads anything: every watermark stays where it is
        }
        for (Map.Entry<Integer, SpoolEvents.Report> e : reports.entrySet()) {
            int reader = e.getKey();
            if (!e.getValue().active && lowest > followed.getOrDefault(reader, Long.MIN_VALUE)) {
                followed.put(reader, lowest);
                context.sendEventToSourceReader(reader, new SpoolEvents.Follow(lowest));
            }
        }
    }

    @Override
    public State snapshotState(long checkpointId) {
        return new State(new HashSet<>(assigned), new ArrayList<>(undelivered));
    }

    @Override
    public void close() {}

    private static final class Scan {
        final Set<String> listed = new HashSet<>();
        final List<SpoolSplit> found = new ArrayList<>();
    }

    /** Checkpoint of the enumerator. */
    static final class State {
        final Set<String> assigned;
        final List<SpoolSplit> undelivered;

        State(Set<String> assigned, List<SpoolSplit> undelivered) {
            this.assigned = assigned;
            this.undelivered = undelivered;
        }
    }

    /** Version 1: the assigned paths, then the undelivered splits. */
    static final class StateSerializer implements org.apache.flink.core.io.SimpleVersionedSerializer<State> {
        static final StateSerializer INSTANCE = new StateSerializer();

        @Override
        public int getVersion() {
            return 1;
        }

        @Override
        public byte[] serialize(State state) throws IOException {
            org.apache.flink.core.memory.DataOutputSerializer out = new org.apache.flink.core.memory.DataOutputSerializer(256);
            out.writeInt(state.assigned.size());
            for (String path : state.assigned) {
                out.writeUTF(path);
            }
            out.writeInt(state.undelivered.size());
            for (SpoolSplit split : state.undelivered) {
                SpoolSplit.Serializer.write(split, out);
            }
            return out.getCopyOfBuffer();
        }

        @Override
        public State deserialize(int version, byte[] bytes) throws IOException {
            if (version != 1) {
                throw new IOException("unknown llmsla-spool enumerator state version " + version);
            }
            org.apache.flink.core.memory.DataInputDeserializer in = new org.apache.flink.core.memory.DataInputDeserializer(bytes);
            Set<String> assigned = new HashSet<>();
            for (int i = in.readInt(); i > 0; i--) {
                assigned.add(in.readUTF());
            }
            List<SpoolSplit> undelivered = new ArrayList<>();
            for (int i = in.readInt(); i > 0; i--) {
                undelivered.add(SpoolSplit.Serializer.read(in));
            }
            return new State(assigned, undelivered);
        }
    }
}
