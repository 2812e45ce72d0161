package dev.llmsla.flink;

import org.apache.flink.api.connector.source.SourceEvent;

/** Messages between the spool enumerator and its readers. */
final class SpoolEvents {
    private SpoolEvents() {}

    /**
     * Enumerator to reader: a scan's segments are all assigned (the first one's: the watermark may
     * leave MIN). Sent after every scan whose assignment took several chunks, after {@link Hold}.
     */
    static final class ScanDone implements SourceEvent {
        private static final long serialVersionUID = 1L;
    }

    /** Enumerator to reader: a scan's segments come in several chunks; keep the watermark until ScanDone. */
    static final class Hold implements SourceEvent {
        private static final long serialVersionUID = 1L;
    }

    /** Reader to enumerator: its current watermark, and whether it has anything of its own to read. */
    static final class Report implements SourceEvent {
        private static final long serialVersionUID = 1L;
        final long watermark;
        final boolean active;

        Report(long watermark, boolean active) {
            this.watermark = watermark;
            this.active = active;
        }
    }

    /**
     * Enumerator to an inactive reader: the lowest watermark among the active readers. The reader
     * follows it instead of declaring itself idle (see SpoolReader: why not idle).
     */
    static final class Follow implements SourceEvent {
        private static final long serialVersionUID = 1L;
        final long watermark;

        Follow(long watermark) {
            this.watermark = watermark;
        }
    }
}
