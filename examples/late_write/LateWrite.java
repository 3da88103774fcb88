// The late write's producer in the Java client (kafka-clients 4.4: transaction version 2 on
// a 4.x broker), the same script as labkit/pipelines/late_write.py (librdkafka), read there:
//   txn 1: one record "t1"; txn 2: one record "t2", then `LABKIT {"event": "txn2-written"}`
//   and a wait for a line on stdin (the lab delivers the request it kept), then txn 2 ends
//   the way the late request would not. Every outcome is a `LABKIT {json}` line.
// Run by the lab with Java's single-file launcher on the jars it fetched:
//   java -cp '<jars>/*' LateWrite.java BOOTSTRAP TOPIC TRANSACTIONAL_ID produce|endtxn
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.internals.AppInfoParser;

public class LateWrite {
    static final int REQUEST_TIMEOUT_MS = 2000;  // as late_write.py: the client gives up fast
    static final int DELIVERY_TIMEOUT_MS = 2000;  // = request timeout: the first attempt's

    static void say(String event, String... fields) {
        StringBuilder out = new StringBuilder("LABKIT {\"event\": \"" + event + "\"");
        for (int i = 0; i + 1 < fields.length; i += 2) {
            String value = fields[i + 1];
            out.append(", \"").append(fields[i]).append("\": ")
               .append(value == null ? "null" : "\"" + value.replace("\\", "\\\\").replace("\"", "'") + "\"");
        }
        System.out.println(out.append("}"));
        System.out.flush();
    }

    static String describe(Throwable e) {
        Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
        return cause.getClass().getSimpleName() + ": " + cause.getMessage();
    }

    // Commit or abort as the Java client's classes say: a timeout is retried (the call may
    // be repeated), fencing is fatal (this instance must stop), anything else aborts.
    static void end(KafkaProducer<byte[], byte[]> producer, String txn, String how) {
        String error = null, retried = null;
        for (int attempt = 0; attempt < 3; attempt++) {
            try {
                if (how.equals("commit")) producer.commitTransaction(); else producer.abortTransaction();
                retried = error;  // a retried call that succeeded ended it
                error = null;
                break;
            } catch (TimeoutException e) {
                error = describe(e);
            } catch (ProducerFencedException | InvalidProducerEpochException e) {
                say("ended", "txn", txn, "asked", how, "error", describe(e), "fatal", "true");
                return;
            } catch (KafkaException e) {
                error = describe(e);
                if (!how.equals("commit")) break;
                how = "abort";  // an abortable error: abort, as the client asks
            }
        }
        say("ended", "txn", txn, "asked", how, "error", error, "retried_after", retried);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4 || !(args[3].equals("produce") || args[3].equals("endtxn"))) {
            System.err.println("usage: LateWrite.java BOOTSTRAP TOPIC TRANSACTIONAL_ID produce|endtxn");
            System.exit(2);
        }
        String topic = args[1], hold = args[3];
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("transactional.id", args[2]);
        props.put("request.timeout.ms", REQUEST_TIMEOUT_MS);
        props.put("delivery.timeout.ms", DELIVERY_TIMEOUT_MS);
        props.put("linger.ms", 0);
        props.put("max.block.ms", 30000);
        props.put("transaction.timeout.ms", 60000);
        props.put("key.serializer", ByteArraySerializer.class);
        props.put("value.serializer", ByteArraySerializer.class);
        BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            say("ready", "client", "kafka-clients " + AppInfoParser.getVersion());
            for (String txn : new String[] {"t1", "t2"}) {
                // as late_write.intended: the held Produce's txn 1 aborts, the held EndTxn's commits
                boolean commit = txn.equals("t1") == hold.equals("endtxn");
                producer.beginTransaction();
                String value = "{\"id\": \"" + txn + "\", \"key\": \"k\", \"txn\": \"" + txn + "\"}";
                String error = null;
                try {
                    producer.send(new ProducerRecord<>(topic, "k".getBytes(), value.getBytes())).get();
                } catch (ExecutionException e) {
                    error = describe(e);
                }
                say("written", "txn", txn, "error", error);
                if (txn.equals("t2")) {
                    say("txn2-written");
                    stdin.readLine();  // the lab delivers the kept request meanwhile
                }
                end(producer, txn, commit ? "commit" : "abort");
            }
        }
        say("done");
    }
}
