package dev.llmsla.flink;

import java.util.ArrayList;
import java.util.List;

import org.apache.flink.api.dag.Transformation;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.table.api.Expressions;
import org.apache.flink.table.api.Table;
import org.apache.flink.table.api.bridge.internal.AbstractStreamTableEnvironmentImpl;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.table.catalog.CatalogManager;
import org.apache.flink.table.catalog.ContextResolvedTable;
import org.apache.flink.table.catalog.ExternalCatalogTable;
import org.apache.flink.table.catalog.ResolvedCatalogTable;
import org.apache.flink.table.catalog.ResolvedSchema;
import org.apache.flink.table.catalog.SchemaTranslator;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.expressions.Expression;
import org.apache.flink.table.operations.ExternalModifyOperation;
import org.apache.flink.table.operations.ModifyOperation;
import org.apache.flink.table.operations.QueryOperation;
import org.apache.flink.table.operations.utils.OperationTreeBuilder;
import org.apache.flink.table.types.DataType;
import org.apache.flink.types.Row;

/**
 * {@code toDataStream} for several tables in ONE planner translation.
 *
 * <p>Why: {@code StreamTableEnvironment.toDataStream} plans each table on its own, so two tables
 * that read the same view (the job's window and dead-letter outputs both read the checked stream)
 * would read the source twice; and a single UNION ALL of them is planned as one tree, in which the
 * planner copies the checked view's expressions into each branch (every record is validated
 * twice). Translated together, the outputs form a DAG: the shared view becomes its own block,
 * computed once. This replays what {@code toDataStream(Table)} does (Flink 2.3 internals; the jar is
 * compiled per Flink version).
 */
public final class TableStreams {
    private TableStreams() {}

    @SuppressWarnings("unchecked")
    public static List<DataStream<Row>> toDataStreams(StreamTableEnvironment tableEnv, List<Table> tables) {
        AbstractStreamTableEnvironmentImpl env = (AbstractStreamTableEnvironmentImpl) tableEnv;
        CatalogManager catalogs = env.getCatalogManager();
        OperationTreeBuilder trees = env.getOperationTreeBuilder();
        List<ModifyOperation> operations = new ArrayList<>();
        for (Table table : tables) {
            ResolvedSchema schema = table.getResolvedSchema();
            SchemaTranslator.ProducingResult result = SchemaTranslator.createProducingResult(
                    catalogs.getDataTypeFactory(), schema, schema.toSourceRowDataType());
            QueryOperation query = table.getQueryOperation();
            if (result.getProjections().isPresent()) {
                List<Expression> projections = new ArrayList<>();
                for (String name : result.getProjections().get()) {
                    projections.add(Expressions.$(name));
                }
                query = trees.project(projections, query);
            }
            ResolvedCatalogTable sink = catalogs.resolveCatalogTable(new ExternalCatalogTable(result.getSchema()));
            DataType physical = result.getPhysicalDataType()
                    .orElseGet(() -> sink.getResolvedSchema().toPhysicalRowDataType());
            operations.add(new ExternalModifyOperation(ContextResolvedTable.anonymous("datastream_sink", sink),
                    query, ChangelogMode.insertOnly(), physical, null));
        }
        List<Transformation<?>> transformations = env.getPlanner().translate(operations);
        if (transformations.size() != tables.size()) {
            throw new IllegalStateException("expected one transformation per table, got " + transformations.size());
        }
        StreamExecutionEnvironment exec = env.execEnv();
        List<DataStream<Row>> streams = new ArrayList<>();
        for (Transformation<?> transformation : transformations) {
            exec.addOperator(transformation);
            streams.add(new DataStream<>(exec, (Transformation<Row>) transformation));
        }
        exec.configure(env.getConfig().getConfiguration());
        return streams;
    }
}
