/*
 * A running count per key written with real Kafka Streams (kafka-streams 4.4.0), the way a
 * user would: a KStream grouped by key, a count in a persistent state store (its changelog
 * in Kafka), every new count sent downstream. One setting, processing.guarantee, decides
 * between at_least_once and exactly_once_v2.
 *
 * Run by `labkit torture --check counts` (no compile step: Java 17's single-file launcher):
 *
 *     java -cp '.cache/jars/streams/*' examples/torture/StreamsRunningCount.java \
 *         --guarantee exactly_once_v2
 *
 * (`labkit.torture.apps.streams_command(guarantee)` builds that command.) It reads the
 * environment the harness sets: LABKIT_BOOTSTRAP, LABKIT_INPUT_TOPIC, LABKIT_OUTPUT_TOPIC,
 * LABKIT_GROUP_ID (the application.id, so the consumer group whose committed offsets the
 * harness watches) and LABKIT_HISTORY (its directory holds this run's state.dir); against a
 * cluster that wants TLS or credentials, LABKIT_KAFKA_JAVA_CONFIG: a Java client properties
 * file (security.protocol, sasl.jaas.config, ssl.truststore.*) loaded into the app's config.
 * PROCESSING_GUARANTEE in the environment is the same as --guarantee.
 *
 * --transactional-stores sets enable.transactional.statestores (KIP-892, new in Kafka
 * Streams 4.4, default false): under exactly_once_v2 a crashed instance keeps its local
 * state instead of wiping it and restoring it from the changelog. For the `streams-restore`
 * experiment the app prints one JSON line per event, prefixed "LABKIT ": each store
 * partition's restore (records restored, its offsets, its milliseconds), the state RUNNING,
 * and the first record it processes after its start, each with the wall clock in ms.
 *
 * Input: the lab's JSON records, keyed by their `key` field (labkit.pipelines.data.load_into_topic),
 * so the count groups by the record key with no repartition topic. Output: for every input
 * record, {"key": ..., "count": <the count so far for that key>} keyed by the same key.
 */

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Reader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;

public class StreamsRunningCount {

    public static void main(String[] args) throws Exception {
        String guarantee = System.getenv().getOrDefault("PROCESSING_GUARANTEE", "exactly_once_v2");
        long commitIntervalMs = 1000;
        double workMs = 0;
        String stateDir = null;
        boolean transactionalStores = false;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--guarantee" -> guarantee = args[++i];
                case "--commit-interval-ms" -> commitIntervalMs = Long.parseLong(args[++i]);
                case "--work-ms" -> workMs = Double.parseDouble(args[++i]);
                case "--state-dir" -> stateDir = args[++i];
                case "--transactional-stores" -> transactionalStores = true;
                default -> usage("unknown argument " + args[i]);
            }
        }
        if (!guarantee.equals(StreamsConfig.AT_LEAST_ONCE) && !guarantee.equals(StreamsConfig.EXACTLY_ONCE_V2)) {
            usage("--guarantee must be at_least_once or exactly_once_v2, not " + guarantee);
        }
        String appId = env("LABKIT_GROUP_ID");
        if (stateDir == null) {
            // One state directory per torture run, kept across the restarts of that run:
            // Kafka Streams keeps its process id there, so a restarted instance gets the same
            // transactional.id (exactly_once_v2) and fences its killed predecessor at once.
            String history = System.getenv("LABKIT_HISTORY");
            stateDir = history != null
                    ? Path.of(history).toAbsolutePath().getParent().resolve("streams-state").toString()
                    : Path.of(System.getProperty("java.io.tmpdir"), "kafka-streams").toString();
        }

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, env("LABKIT_BOOTSTRAP"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        // The same interval for both guarantees (exactly_once_v2 would default to 100 ms,
        // at_least_once to 30 s): the experiment changes one setting only.
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitIntervalMs);
        // No record cache: every new count goes to the changelog and downstream at once (as
        // the lab's Python running count does), not only at the next commit.
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        // Static membership: a restarted instance takes its predecessor's place in the group
        // at once instead of waiting for the dead one's session to time out.
        props.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, appId + "-1");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        if (transactionalStores) {
            props.put(StreamsConfig.TRANSACTIONAL_STATE_STORES_CONFIG, true);
        }
        // The cluster's connection settings (TLS, SASL), as a deployment hands them to an app.
        String clientConfig = System.getenv("LABKIT_KAFKA_JAVA_CONFIG");
        if (clientConfig != null && !clientConfig.isEmpty()) {
            try (Reader in = Files.newBufferedReader(Path.of(clientConfig))) {
                props.load(in);
            }
        }

        ObjectMapper json = new ObjectMapper();
        long workNanos = (long) (workMs * 1_000_000);
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(env("LABKIT_INPUT_TOPIC"), Consumed.with(Serdes.String(), Serdes.String()))
                .peek((key, value) -> work(workNanos))  // a real app does something per record
                .groupByKey()
                .count(Materialized.as("running-count"))
                .toStream()
                .mapValues((key, count) -> {
                    Map<String, Object> out = new LinkedHashMap<>();
                    out.put("key", key);
                    out.put("count", count);
                    try {
                        return json.writeValueAsString(out);
                    } catch (Exception e) {
                        throw new IllegalStateException(e);
                    }
                })
                .to(env("LABKIT_OUTPUT_TOPIC"), Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        // An error the app cannot handle ends the process with a non-zero code, so a
        // supervisor (the harness) sees a crash instead of a silent, idle JVM.
        streams.setUncaughtExceptionHandler(e -> {
            System.err.println("StreamsRunningCount: " + e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.ERROR) {
                Runtime.getRuntime().halt(1);
            }
            if (now == KafkaStreams.State.RUNNING) {
                event("running", Map.of());
            }
        });
        streams.setGlobalStateRestoreListener(new RestoreCounter());
        // SIGTERM: close cleanly (commit, flush); SIGKILL, the harness's fault, skips this.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(5))));
        System.out.println("StreamsRunningCount: " + guarantee + ", commit.interval.ms="
                + commitIntervalMs + ", state.dir=" + stateDir
                + ", enable.transactional.statestores=" + transactionalStores);
        streams.start();
        Thread.currentThread().join();  // runs until stopped, like a real streaming app
    }

    private static volatile boolean firstRecord = false;

    /** One line "LABKIT {json}" on stdout: what happened, and when (the wall clock, ms). */
    private static synchronized void event(String what, Map<String, Object> fields) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", what);
        line.put("at_ms", System.currentTimeMillis());
        line.putAll(fields);
        try {
            System.out.println("LABKIT " + new ObjectMapper().writeValueAsString(line));
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
        System.out.flush();
    }

    /** Each store partition's restore from its changelog: how many records, from where. */
    private static final class RestoreCounter implements StateRestoreListener {
        private final Map<TopicPartition, long[]> restoring = new java.util.concurrent.ConcurrentHashMap<>();

        @Override
        public void onRestoreStart(TopicPartition partition, String store, long start, long end) {
            restoring.put(partition, new long[] {0, System.currentTimeMillis()});
            event("restore-start", Map.of("store", store, "changelog", partition.toString(),
                    "start_offset", start, "end_offset", end));
        }

        @Override
        public void onBatchRestored(TopicPartition partition, String store, long batchEnd, long n) {
            restoring.computeIfAbsent(partition, p -> new long[] {0, System.currentTimeMillis()})[0] += n;
        }

        @Override
        public void onRestoreEnd(TopicPartition partition, String store, long total) {
            long[] seen = restoring.getOrDefault(partition, new long[] {0, System.currentTimeMillis()});
            event("restore-end", Map.of("store", store, "changelog", partition.toString(),
                    "restored", total, "ms", System.currentTimeMillis() - seen[1]));
        }
    }

    private static void work(long nanos) {
        if (!firstRecord) {  // for streams-restore: when processing resumed after a start
            firstRecord = true;
            event("first-record", Map.of());
        }
        if (nanos <= 0) {
            return;
        }
        try {
            Thread.sleep(nanos / 1_000_000, (int) (nanos % 1_000_000));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private static String env(String name) {
        String value = System.getenv(name);
        if (value == null || value.isEmpty()) {
            usage(name + " is not set (labkit torture sets it)");
        }
        return value;
    }

    private static void usage(String problem) {
        System.err.println("StreamsRunningCount: " + problem + "\nusage: java -cp <kafka-streams jars> "
                + "StreamsRunningCount.java [--guarantee at_least_once|exactly_once_v2] "
                + "[--commit-interval-ms N] [--work-ms MS] [--state-dir DIR] [--transactional-stores]");
        System.exit(2);
    }
}
