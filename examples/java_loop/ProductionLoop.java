// The lab's exactly-once loop (labkit/pipelines/production_loop.py) in the Java client,
// kafka-clients 4.4, line for line: a read_committed consumer in a group, a transactional
// producer, the consumer's position on every assigned partition sent with each transaction
// with its group metadata (KIP-447), an abort and a rewind on any error inside the
// transaction, a stop on a fatal one. The judge runs it as it runs the Python loop (Lab.java:
// the settings, the crash points, the fee). One difference: the positions and the group
// metadata are taken right after poll(), as the batch is read (the KIP-848 consumer rejoins a
// fenced member in the background, below).
//
// The Java client's classes of error (KIP-1050), as this loop follows them:
//   TransactionAbortableException (and any other error inside the transaction): abort it,
//     rewind, read the batch again
//   ApplicationRecoverableException (ProducerFencedException, InvalidProducerEpochException,
//     FencedInstanceIdException): this instance is fenced: close and stop; a supervisor
//     starts it again and initTransactions() fences what is left of it
//   TimeoutException from commitTransaction(): call it again (the call may be repeated)
//   an error the producer cannot abort (its fatal state: a commit answered INVALID_TXN_STATE,
//     as a 4.4 broker answers one that races its fencing, KAFKA-20785): abortTransaction()
//     itself throws ("Cannot execute transactional method because we are in an error
//     state", caused by that error), and the instance stops as a fenced one does; Kafka's
//     javadoc loop handles it the same way
//   IllegalStateException "No current assignment" (KIP-848 only): kafka-clients 4.4 clears a
//     fenced member's partitions on its background thread while this thread reads one; the
//     instance stops, and its restart reads the batch again
//   max.block.ms: how long any blocking call (init, send, commit, abort) waits at most
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ApplicationRecoverableException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ProductionLoop {
    public static void main(String[] args) {
        Lab.run(ProductionLoop::feeService);
    }

    // After an abort: every partition this instance holds back to its committed offset, where
    // the aborted transaction began on it, so the batch is read again.
    static void rewind(KafkaConsumer<byte[], byte[]> consumer) {
        Map<TopicPartition, OffsetAndMetadata> committed =
            consumer.committed(consumer.assignment(), Duration.ofSeconds(30));
        for (TopicPartition tp : consumer.assignment()) {
            OffsetAndMetadata start = committed.get(tp);
            if (start == null) {
                consumer.seekToBeginning(List.of(tp));  // nothing committed yet
            } else {
                consumer.seek(tp, start);
            }
        }
    }

    // The next record to read on every assigned partition.
    static Map<TopicPartition, OffsetAndMetadata> positions(KafkaConsumer<byte[], byte[]> consumer) {
        Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
        for (TopicPartition tp : consumer.assignment()) {
            next.put(tp, new OffsetAndMetadata(consumer.position(tp, Duration.ofSeconds(30))));
        }
        return next;
    }

    static void commit(KafkaProducer<byte[], byte[]> producer) {
        for (int attempt = 1; ; attempt++) {
            try {
                producer.commitTransaction();
                return;
            } catch (TimeoutException e) {  // not known whether it committed: ask again
                if (attempt == 5) {
                    throw e;
                }
            }
        }
    }

    static void feeService() throws Exception {
        String groupProtocol = Lab.setting("group_protocol");
        Properties c = Lab.clientConfig();  // how to reach your cluster
        c.put("bootstrap.servers", Lab.setting("bootstrap"));
        c.put("group.id", Lab.setting("group_id"));
        c.put("group.protocol", groupProtocol);  // "classic", or "consumer" (KIP-848)
        c.put("group.instance.id", Lab.setting("instance_id"));  // (1)
        if (groupProtocol.equals("classic")) {
            c.put("session.timeout.ms", 10000);  // (1)
        }
        c.put("isolation.level", "read_committed");  // the Java client's default reads aborted records
        c.put("enable.auto.commit", false);  // the offsets go into the transaction instead
        c.put("auto.offset.reset", "earliest");
        c.put("max.poll.records", Integer.parseInt(Lab.setting("batch_size")));
        c.put("key.deserializer", ByteArrayDeserializer.class);
        c.put("value.deserializer", ByteArrayDeserializer.class);
        Properties p = Lab.clientConfig();
        p.put("bootstrap.servers", Lab.setting("bootstrap"));
        p.put("transactional.id", Lab.setting("transactional_id"));
        p.put("transaction.timeout.ms", 60000);  // (2)
        p.put("max.block.ms", 30000);  // (3) every blocking call bounded
        p.put("key.serializer", ByteArraySerializer.class);
        p.put("value.serializer", ByteArraySerializer.class);
        String output = Lab.setting("output_topic");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c);
             KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();  // fences an older instance and aborts what it left open
            consumer.subscribe(List.of(Lab.setting("input_topic")));
            while (!Lab.stopping()) {  // SIGTERM: finish the batch, then stop
                ConsumerRecords<byte[], byte[]> batch = consumer.poll(Duration.ofSeconds(1));
                if (batch.isEmpty()) {
                    continue;
                }
                // What this batch's transaction will commit, taken with the batch: the KIP-848
                // consumer may move the partitions on in the background while it is processed,
                // and groupMetadata() then carries the new epoch, which lets a zombie's offsets
                // in; with the epoch the batch was read under, they are refused
                Map<TopicPartition, OffsetAndMetadata> next = positions(consumer);
                ConsumerGroupMetadata member = consumer.groupMetadata();
                Lab.crashPoint("after-poll-before-process");
                producer.beginTransaction();
                try {
                    int n = 0;
                    for (ConsumerRecord<byte[], byte[]> msg : batch) {
                        producer.send(new ProducerRecord<>(output, msg.key(), Lab.transform(msg.value())));
                        if (n++ == batch.count() / 2 - 1) {
                            producer.flush();
                            Lab.crashPoint("mid-batch");
                        }
                    }
                    Lab.crashPoint("after-produce-before-flush");
                    producer.flush();
                    Lab.crashPoint("in-transaction-before-commit");
                    producer.sendOffsetsToTransaction(next, member);  // as the batch was read
                    Lab.crashPoint("after-send-offsets-before-commit");
                    commit(producer);  // again while it times out
                } catch (ApplicationRecoverableException e) {
                    throw e;  // fenced by a newer instance: stop (both clients are closed)
                } catch (KafkaException e) {
                    // abortable (TransactionAbortableException), or any other error inside
                    // the transaction: give the batch up
                    producer.abortTransaction();  // drop the output and the offsets...
                    rewind(consumer);  // ...and read the batch again
                    continue;
                }
                Lab.crashPoint("after-commit");
            }
        }
    }
}
