package dev.llmsla.flink;

import java.io.IOException;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.flink.api.connector.source.SourceSplit;
import org.apache.flink.core.io.SimpleVersionedSerializer;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;

/**
 * One published spool segment, read from {@code offset} (bytes); or, in a reader's checkpoint only,
 * the table of that reader's active writers (their highest event time), so a restored reader holds
 * its watermark back for a writer whose next segment was not yet published when it went down.
 *
 * <p>{@code start} is the event time of the segment's first line with a usable {@code ts_ms}
 * ({@link Long#MIN_VALUE} when the head has none: the segment then sorts first and holds the
 * watermark until it is read); {@code writer} is the writer part of the name (SpoolFiles).
 */
public final class SpoolSplit implements SourceSplit {
    private final String path;
    private final String writer;
    private final long start;
    private final long offset;
    /** Non-null only for a writer table: writer -> highest event time seen. */
    private final Map<String, Long> writers;

    public SpoolSplit(String path, String writer, long start, long offset) {
        this.path = path;
        this.writer = writer;
        this.start = start;
        this.offset = offset;
        this.writers = null;
    }

    private SpoolSplit(String id, Map<String, Long> writers) {
        this.path = id;
        this.writer = "";
        this.start = Long.MIN_VALUE;
        this.offset = 0;
        this.writers = Collections.unmodifiableMap(new LinkedHashMap<>(writers));
    }

    static SpoolSplit writerTable(int subtask, Map<String, Long> writers) {
        return new SpoolSplit("writers@" + subtask, writers);
    }

    @Override
    public String splitId() {
        return path;
    }

    public String path() {
        return path;
    }

    public String writer() {
        return writer;
    }

    public long start() {
        return start;
    }

    public long offset() {
        return offset;
    }

    boolean isWriterTable() {
        return writers != null;
    }

    Map<String, Long> writers() {
        return writers;
    }

    SpoolSplit at(long newOffset) {
        return new SpoolSplit(path, writer, start, newOffset);
    }

    @Override
    public String toString() {
        return isWriterTable() ? "SpoolSplit{" + path + ", " + writers.size() + " writers}"
                : "SpoolSplit{" + path + " @" + offset + ", writer " + writer + ", start " + start + "}";
    }

    /** Version 1: a kind byte, then the file fields or the writer table. */
    public static final class Serializer implements SimpleVersionedSerializer<SpoolSplit> {
        public static final Serializer INSTANCE = new Serializer();

        @Override
        public int getVersion() {
            return 1;
        }

        @Override
        public byte[] serialize(SpoolSplit split) throws IOException {
            DataOutputSerializer out = new DataOutputSerializer(64);
            write(split, out);
            return out.getCopyOfBuffer();
        }

        static void write(SpoolSplit split, DataOutputSerializer out) throws IOException {
            if (split.isWriterTable()) {
                out.writeByte(1);
                out.writeUTF(split.path);
                out.writeInt(split.writers.size());
                for (Map.Entry<String, Long> e : split.writers.entrySet()) {
                    out.writeUTF(e.getKey());
                    out.writeLong(e.getValue());
                }
            } else {
                out.writeByte(0);
                out.writeUTF(split.path);
                out.writeUTF(split.writer);
                out.writeLong(split.start);
                out.writeLong(split.offset);
            }
        }

        @Override
        public SpoolSplit deserialize(int version, byte[] bytes) throws IOException {
            if (version != 1) {
                throw new IOException("unknown SpoolSplit version " + version);
            }
            return read(new DataInputDeserializer(bytes));
        }

        static SpoolSplit read(DataInputDeserializer in) throws IOException {
            byte kind = in.readByte();
            String path = in.readUTF();
            if (kind == 1) {
                int n = in.readInt();
                Map<String, Long> writers = new LinkedHashMap<>();
                for (int i = 0; i < n; i++) {
                    writers.put(in.readUTF(), in.readLong());
                }
                return new SpoolSplit(path, writers);
            }
            return new SpoolSplit(path, in.readUTF(), in.readLong(), in.readLong());
        }
    }
}
