package dev.llmsla.flink;

import java.io.Serializable;
import java.net.URI;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.ReadableConfig;
import org.apache.flink.table.catalog.WatermarkSpec;
import org.apache.flink.table.connector.format.DecodingFormat;
import org.apache.flink.table.connector.source.DynamicTableSource;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.factories.DeserializationFormatFactory;
import org.apache.flink.table.factories.DynamicTableSourceFactory;
import org.apache.flink.table.factories.FactoryUtil;

/**
 * Connector {@code 'connector' = 'llmsla-spool'}: one spool kind directory as a table.
 *
 * <p>Why not Flink's {@code filesystem} connector: it reads the segments found by a scan in no set
 * order, one at a time, under one max-based watermark, so a backlog written by several writers
 * (whose segments overlap in event time by more than any sensible delay) came out mostly late.
 * Here each writer's segments are read in order by one reader, and the watermark is the minimum of
 * each active writer's progress and of every unread segment's start (see EventTimeTracker).
 *
 * <p>Options: {@code path} (the kind directory), {@code bounded} (read what is there, then end),
 * {@code monitor-interval}, {@code watermark-delay}, {@code watermark-interval}, {@code idle-timeout},
 * {@code max-past}/{@code max-future} (event times outside [now - max-past, now + max-future] never
 * move the watermark) and {@code format} with its own options. Metadata: {@code file.path}. Declare
 * the watermark as {@code WATERMARK FOR rt AS SOURCE_WATERMARK()}.
 */
public class SpoolTableFactory implements DynamicTableSourceFactory {
    public static final String IDENTIFIER = "llmsla-spool";

    public static final ConfigOption<String> PATH = ConfigOptions.key("path").stringType().noDefaultValue()
            .withDescription("the spool kind directory (a path or a file: URI)");
    public static final ConfigOption<Boolean> BOUNDED = ConfigOptions.key("bounded").booleanType().defaultValue(false)
            .withDescription("read the segments published now, then end");
    public static final ConfigOption<Duration> MONITOR_INTERVAL = ConfigOptions.key("monitor-interval").durationType()
            .defaultValue(Duration.ofSeconds(1)).withDescription("how often to look for new segments");
    public static final ConfigOption<Duration> WATERMARK_DELAY = ConfigOptions.key("watermark-delay").durationType()
            .defaultValue(Duration.ZERO).withDescription("out-of-orderness allowed within one writer's events");
    public static final ConfigOption<Duration> WATERMARK_INTERVAL = ConfigOptions.key("watermark-interval")
            .durationType().defaultValue(Duration.ofMillis(200)).withDescription("watermark emission interval");
    public static final ConfigOption<Duration> IDLE_TIMEOUT = ConfigOptions.key("idle-timeout").durationType()
            .defaultValue(Duration.ofSeconds(5))
            .withDescription("a writer without new data for this long stops holding the watermark back");
    public static final ConfigOption<Duration> MAX_PAST = ConfigOptions.key("max-past").durationType()
            .defaultValue(Duration.ofDays(7)).withDescription("older event times never move the watermark");
    public static final ConfigOption<Duration> MAX_FUTURE = ConfigOptions.key("max-future").durationType()
            .defaultValue(Duration.ofMinutes(5)).withDescription("event times further ahead never move the watermark");

    /** The options, resolved. */
    static final class Settings implements Serializable {
        private static final long serialVersionUID = 1L;
        final String dir;
        final boolean bounded;
        final long monitorMillis;
        final long delayMillis;
        final long intervalMillis;
        final long idleMillis;
        final long maxPastMillis;
        final long maxFutureMillis;

        Settings(ReadableConfig o) {
            String path = o.get(PATH);
            dir = (path.startsWith("file:") ? Paths.get(URI.create(path)) : Paths.get(path)).toAbsolutePath().toString();
            bounded = o.get(BOUNDED);
            monitorMillis = Math.max(1, o.get(MONITOR_INTERVAL).toMillis());
            delayMillis = o.get(WATERMARK_DELAY).toMillis();
            intervalMillis = Math.max(1, o.get(WATERMARK_INTERVAL).toMillis());
            idleMillis = o.get(IDLE_TIMEOUT).toMillis();
            maxPastMillis = o.get(MAX_PAST).toMillis();
            maxFutureMillis = o.get(MAX_FUTURE).toMillis();
        }
    }

    @Override
    public DynamicTableSource createDynamicTableSource(Context context) {
        FactoryUtil.TableFactoryHelper helper = FactoryUtil.createTableFactoryHelper(this, context);
        DecodingFormat<DeserializationSchema<RowData>> format =
                helper.discoverDecodingFormat(DeserializationFormatFactory.class, FactoryUtil.FORMAT);
        helper.validate();
        List<WatermarkSpec> specs = context.getCatalogTable().getResolvedSchema().getWatermarkSpecs();
        String rowtime = specs.isEmpty() ? null : specs.get(0).getRowtimeAttribute();
        return new SpoolTableSource(new Settings(helper.getOptions()), format, context.getPhysicalRowDataType(), rowtime);
    }

    @Override
    public String factoryIdentifier() {
        return IDENTIFIER;
    }

    @Override
    public Set<ConfigOption<?>> requiredOptions() {
        Set<ConfigOption<?>> options = new HashSet<>();
        options.add(PATH);
        options.add(FactoryUtil.FORMAT);
        return options;
    }

    @Override
    public Set<ConfigOption<?>> optionalOptions() {
        Set<ConfigOption<?>> options = new HashSet<>();
        options.add(BOUNDED);
        options.add(MONITOR_INTERVAL);
        options.add(WATERMARK_DELAY);
        options.add(WATERMARK_INTERVAL);
        options.add(IDLE_TIMEOUT);
        options.add(MAX_PAST);
        options.add(MAX_FUTURE);
        return options;
    }
}
