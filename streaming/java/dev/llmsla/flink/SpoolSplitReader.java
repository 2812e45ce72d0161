package dev.llmsla.flink;

import java.io.IOException;
import java.io.InputStream;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.NoSuchFileException;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.Collections;
import java.util.PriorityQueue;
import java.util.Set;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.connector.base.source.reader.RecordsWithSplitIds;
import org.apache.flink.connector.base.source.reader.splitreader.SplitReader;
import org.apache.flink.connector.base.source.reader.splitreader.SplitsAddition;
import org.apache.flink.connector.base.source.reader.splitreader.SplitsChange;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.utils.JoinedRowData;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads and parses segments in the fetcher thread (off the task thread, which emits and runs the
 * chained SQL): one segment at a time, the assigned one with the lowest start first (ties by path),
 * lines split on '\n' with a trailing '\r' dropped, each line parsed by the table's format. A
 * last line without '\n' is a {@code truncated} problem (llmsla.spool.read_segment says the same);
 * a segment deleted before it is read is skipped with a warning.
 */
final class SpoolSplitReader implements SplitReader<SpoolSplitReader.Batch, SpoolSplit> {
    private static final Logger LOG = LoggerFactory.getLogger(SpoolSplitReader.class);
    static final int BATCH_RECORDS = 1024;
    private static final int BUFFER = 1 << 20;

    private final DeserializationSchema<RowData> format;
    /** The llmsla-json format, which leaves room for the metadata columns (no copy, no wrapper). */
    private final SpoolJsonDeserializer spoolFormat;
    private final boolean withPath;
    private final PriorityQueue<SpoolSplit> queue = new PriorityQueue<>(
            (a, b) -> a.start() != b.start() ? Long.compare(a.start(), b.start()) : a.path().compareTo(b.path()));

    private SpoolSplit current;
    private InputStream in;
    /** The segment's path as UTF-8 (the BYTES file.path metadata: passed on by reference, not copied per row). */
    private byte[] currentPath;
    private long position;
    private final byte[] buffer = new byte[BUFFER];
    private int bufStart;
    private int bufEnd;
    private boolean eof;
    /** The line nextLine() just returned had no '\n' (the segment's last bytes). */
    private boolean truncated;

    SpoolSplitReader(DeserializationSchema<RowData> format, boolean withPath) {
        this.format = format;
        this.spoolFormat = format instanceof SpoolJsonDeserializer ? (SpoolJsonDeserializer) format : null;
        this.withPath = withPath;
    }

    @Override
    public RecordsWithSplitIds<Batch> fetch() throws IOException {
        if (current == null) {
            current = queue.poll();
            if (current == null) {
                return Batch.EMPTY;
            }
            if (!open(current)) {
                String id = current.splitId();
                current = null;
                return Batch.finished(id);
            }
        }
        Batch batch = new Batch(current.splitId());
        while (batch.size < BATCH_RECORDS) {
            byte[] line = nextLine();
            if (line == null) {
                break;
            }
            RowData row = parse(line);
            if (row != null) {
                batch.add(row, position);
            }
        }
        if (batch.size < BATCH_RECORDS) { // end of the segment
            batch.finished = Collections.singleton(current.splitId());
            closeCurrent();
        }
        return batch;
    }

    private boolean open(SpoolSplit split) throws IOException {
        try {
            FileChannel channel = FileChannel.open(Paths.get(split.path()), StandardOpenOption.READ);
            channel.position(split.offset());
            in = Channels.newInputStream(channel);
        } catch (NoSuchFileException e) {
            LOG.warn("llmsla-spool: {} was deleted before it was read to the end (from byte {}); skipped",
                    split.path(), split.offset());
            return false;
        }
        position = split.offset();
        bufStart = bufEnd = 0;
        eof = false;
        currentPath = split.path().getBytes(StandardCharsets.UTF_8);
        return true;
    }

    /** The next line without its '\n' (and '\r'), a truncated last line with a marker, or null at the end. */
    private byte[] nextLine() throws IOException {
        while (true) {
            for (int i = bufStart; i < bufEnd; i++) {
                if (buffer[i] == '\n') {
                    int end = i > bufStart && buffer[i - 1] == '\r' ? i - 1 : i;
                    byte[] line = Arrays.copyOfRange(buffer, bufStart, end);
                    position += i + 1 - bufStart;
                    bufStart = i + 1;
                    return line;
                }
            }
            if (eof) {
                if (bufStart == bufEnd) {
                    return null;
                }
                byte[] rest = Arrays.copyOfRange(buffer, bufStart, bufEnd);
                position += bufEnd - bufStart;
                bufStart = bufEnd;
                truncated = true;
                return rest;
            }
            if (bufStart > 0) { // keep the partial line, refill behind it
                System.arraycopy(buffer, bufStart, buffer, 0, bufEnd - bufStart);
                bufEnd -= bufStart;
                bufStart = 0;
            }
            if (bufEnd == buffer.length) { // a line longer than the buffer: read it whole
                return longLine();
            }
            int r = in.read(buffer, bufEnd, buffer.length - bufEnd);
            if (r < 0) {
                eof = true;
            } else {
                bufEnd += r;
            }
        }
    }

    private byte[] longLine() throws IOException {
        java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream(buffer.length * 2);
        out.write(buffer, 0, bufEnd);
        bufStart = bufEnd = 0;
        int b;
        long read = out.size();
        while ((b = in.read()) >= 0) {
            read++;
            if (b == '\n') {
                position += read;
                byte[] line = out.toByteArray();
                int n = line.length;
                return n > 0 && line[n - 1] == '\r' ? Arrays.copyOf(line, n - 1) : line;
            }
            out.write(b);
        }
        eof = true;
        position += read;
        truncated = true;
        return out.toByteArray();
    }

    private RowData parse(byte[] line) throws IOException {
        boolean cut = truncated;
        truncated = false;
        if (spoolFormat != null) {
            int extra = withPath ? 1 : 0;
            // like llmsla.spool.read_segment: a last line without '\n' is bad even when blank
            GenericRowData row = cut ? spoolFormat.malformed(line, "truncated", extra) : spoolFormat.deserialize(line, extra);
            if (row != null && withPath) {
                row.setField(row.getArity() - 1, currentPath);
            }
            return row;
        }
        RowData row = format.deserialize(line);
        return row == null || !withPath ? row : new JoinedRowData(row, GenericRowData.of(currentPath));
    }

    private void closeCurrent() throws IOException {
        current = null;
        if (in != null) {
            in.close();
            in = null;
        }
    }

    @Override
    public void handleSplitsChanges(SplitsChange<SpoolSplit> change) {
        if (!(change instanceof SplitsAddition)) {
            throw new UnsupportedOperationException("llmsla-spool: unsupported change " + change);
        }
        queue.addAll(change.splits());
    }

    @Override
    public void wakeUp() {
        // fetch() never blocks for long: nothing to interrupt
    }

    @Override
    public void close() throws Exception {
        closeCurrent();
    }

    /** One fetch: rows of one segment with the byte offset after each, and whether it ended. */
    static final class Batch implements RecordsWithSplitIds<Batch> {
        static final Batch EMPTY = new Batch(null);

        private final String splitId;
        private RowData[] rows = new RowData[16];
        private long[] ends = new long[16];
        private int size;
        private int cursor = -1;
        private boolean splitGiven;
        private Set<String> finished = Collections.emptySet();

        Batch(String splitId) {
            this.splitId = splitId;
        }

        static Batch finished(String splitId) {
            Batch b = new Batch(splitId);
            b.finished = Collections.singleton(splitId);
            return b;
        }

        void add(RowData row, long end) {
            if (size == rows.length) {
                rows = Arrays.copyOf(rows, size * 2);
                ends = Arrays.copyOf(ends, size * 2);
            }
            rows[size] = row;
            ends[size] = end;
            size++;
        }

        RowData row() {
            return rows[cursor];
        }

        long end() {
            return ends[cursor];
        }

        @Override
        public String nextSplit() {
            if (splitGiven || size == 0) {
                return null;
            }
            splitGiven = true;
            return splitId;
        }

        @Override
        public Batch nextRecordFromSplit() {
            if (cursor + 1 < size) {
                cursor++;
                return this;
            }
            return null;
        }

        @Override
        public Set<String> finishedSplits() {
            return finished;
        }
    }
}
