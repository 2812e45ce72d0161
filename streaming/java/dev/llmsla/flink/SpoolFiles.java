package dev.llmsla.flink;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonFactory;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonParser;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonToken;

/**
 * What the spool's file names and heads say: which published segments a kind directory holds,
 * which writer wrote each, and the event time a segment starts at.
 */
final class SpoolFiles {
    /** llmsla.spool.SpoolWriter: {@code <ms>-<host>-<pid>-<tag>-<seq>.jsonl}; the host may hold '-'. */
    private static final Pattern NAME = Pattern.compile("^\\d+-(.+-\\d+-[0-9A-Za-z]+)-\\d+\\.jsonl$");
    static final String SUFFIX = ".jsonl";
    /** Bytes of a segment's head read to find its start. */
    static final int HEAD_BYTES = 64 << 10;

    private static final JsonFactory JSON = new JsonFactory();

    private SpoolFiles() {}

    /** {@code <host>-<pid>-<tag>} of a spool writer's segment; any other name is a writer of its own. */
    static String writerOf(String fileName) {
        Matcher m = NAME.matcher(fileName);
        return m.matches() ? m.group(1) : fileName;
    }

    /** A published segment: {@code *.jsonl}, not hidden (dot) or private ({@code _}), like before. */
    static boolean isPublished(Path file) {
        String name = file.getFileName().toString();
        return name.endsWith(SUFFIX) && !name.startsWith(".") && !name.startsWith("_")
                && Files.isRegularFile(file);
    }

    /** Published segments of a kind directory (none when it does not exist yet). */
    static List<Path> published(Path dir) throws IOException {
        List<Path> out = new ArrayList<>();
        try (DirectoryStream<Path> entries = Files.newDirectoryStream(dir)) {
            for (Path p : entries) {
                if (isPublished(p)) {
                    out.add(p);
                }
            }
        } catch (NoSuchFileException e) {
            // not created yet: nothing published
        }
        return out;
    }

    /**
     * The {@code ts_ms} of the first line in the head of {@code file} whose {@code ts_ms} is an
     * integer within {@code [lo, hi]} (the range the watermark trusts); {@link Long#MIN_VALUE} when
     * none is (unknown: the segment sorts first and holds the watermark until it is read).
     */
    static long startOf(Path file, long lo, long hi) {
        byte[] head = new byte[HEAD_BYTES];
        int n = 0;
        int from = 0;
        try (InputStream in = Files.newInputStream(file)) {
            while (n < head.length) { // usually the first 4 KB hold the first line: read no more
                int r = in.read(head, n, Math.min(4096, head.length - n));
                if (r <= 0) {
                    break;
                }
                for (int i = n; i < n + r; i++) {
                    if (head[i] == '\n') {
                        long ts = timestamp(head, from, i - from);
                        if (ts >= lo && ts <= hi) {
                            return ts;
                        }
                        from = i + 1;
                    }
                }
                n += r;
            }
        } catch (IOException e) {
            return Long.MIN_VALUE; // gone or unreadable: the reader says why
        }
        return Long.MIN_VALUE;
    }

    private static long timestamp(byte[] buf, int off, int len) {
        try (JsonParser p = JSON.createParser(buf, off, len)) {
            if (p.nextToken() != JsonToken.START_OBJECT) {
                return Long.MIN_VALUE;
            }
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                String name = p.currentName();
                JsonToken value = p.nextToken();
                if ("ts_ms".equals(name)) {
                    if (value == JsonToken.VALUE_NUMBER_INT && p.getNumberType() != JsonParser.NumberType.BIG_INTEGER) {
                        return p.getLongValue();
                    }
                    if (value == JsonToken.VALUE_NUMBER_FLOAT) {
                        double d = p.getDoubleValue();
                        return d == Math.rint(d) && Math.abs(d) < 9.2e18 ? (long) d : Long.MIN_VALUE;
                    }
                    return Long.MIN_VALUE;
                }
                p.skipChildren();
            }
        } catch (IOException | RuntimeException e) {
            // not JSON: not this line
        }
        return Long.MIN_VALUE;
    }
}
