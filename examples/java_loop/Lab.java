// The lab's side of a Java loop, as labkit.faults.crashpoints and labkit.faults.runner are a
// Python loop's: its settings, its named crash points, the fee it computes, and what it
// raised written to the run's history. The judge (labkit.experiments.judge) compiles this
// file with the learner's loop once per run and starts the loop as supervised processes.
//
//   Lab.setting("input_topic")           a setting the judge gives (each is an environment
//                                        variable of that name, as a Python loop's keyword)
//   Lab.crashPoint("mid-batch")          SIGKILL (or SIGSTOP) this JVM here when armed through
//                                        LABKIT_CRASH_AT / LABKIT_CRASH_HIT / LABKIT_CRASH_STALL
//   Lab.transform(value)                 the card fee, as labkit.pipelines.ctp.transform
//   Lab.run(Loop::service)               main(): a raised exception is recorded, exit 1
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.errors.ApplicationRecoverableException;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.TransactionAbortableException;
import org.apache.kafka.common.errors.UnreleasedInstanceIdException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.protocol.Errors;

public final class Lab {
    // The same names as labkit.faults.crashpoints.CRASH_POINTS (tests/test_judge_java_loop.py
    // compares them): a point not in it is a typo that must not silently never fire.
    static final List<String> CRASH_POINTS = List.of(
        "after-poll-before-process", "after-process-before-commit", "after-commit-before-process",
        "mid-batch", "after-produce-before-flush", "in-transaction-before-commit",
        "after-send-offsets-before-commit", "after-commit", "after-state-update-before-commit",
        "after-db-commit-before-produce", "after-produce-before-db-commit",
        "after-payment-before-event", "after-acquire-before-process", "after-process-before-ack",
        "after-ack", "spark-mid-sink", "spark-after-sink-before-commit", "spark-after-commit",
        "spark-task-first-attempt");

    private static final String TRANSACTION_MANAGER =
        "org.apache.kafka.clients.producer.internals.TransactionManager";
    private static final Map<String, Integer> visits = new HashMap<>();
    private static final ObjectMapper json = new ObjectMapper();
    private static volatile boolean stopping = false;
    private static final CountDownLatch ended = new CountDownLatch(1);

    public interface Loop {
        void run() throws Exception;
    }

    private Lab() {
    }

    /** A setting the lab gives this instance (an environment variable of that name). */
    public static String setting(String name) {
        String value = System.getenv(name);
        if (value == null) {
            throw new IllegalStateException("no setting " + name + " in the environment: the lab "
                + "gives bootstrap, input_topic, output_topic, group_id, transactional_id, "
                + "instance_id, group_protocol, batch_size");
        }
        return value;
    }

    /** The cluster's connection settings (TLS, SASL) in the Java client's names, if any. */
    public static Properties clientConfig() throws IOException {
        Properties props = new Properties();
        String file = System.getenv("LABKIT_KAFKA_JAVA_CONFIG");
        if (file != null && !file.isEmpty()) {
            try (InputStream in = new FileInputStream(file)) {
                props.load(in);
            }
        }
        return props;
    }

    /** Mark a place in the loop; die here (SIGKILL: nothing flushed, closed or committed) or
     *  freeze (SIGSTOP, until the supervisor's SIGCONT) if the lab armed it. */
    public static void crashPoint(String name) {
        if (!CRASH_POINTS.contains(name)) {
            throw new IllegalArgumentException("unknown crash point " + name + ". Valid crash "
                + "points: " + String.join(", ", CRASH_POINTS));
        }
        if (!name.equals(System.getenv("LABKIT_CRASH_AT"))) {
            return;
        }
        int hit = Integer.parseInt(System.getenv().getOrDefault("LABKIT_CRASH_HIT", "1"));
        boolean stall = !System.getenv().getOrDefault("LABKIT_CRASH_STALL", "").isEmpty();
        int visit = visits.merge(name, 1, Integer::sum);
        if (stall && visit == hit) {
            signalSelf("STOP");  // returns once the supervisor sends SIGCONT
        } else if (!stall && visit >= hit) {
            signalSelf("KILL");
            while (true) {  // the signal is on its way: not one more line of the loop runs
                try {
                    Thread.sleep(1000);
                } catch (InterruptedException e) {
                    // still dying
                }
            }
        }
    }

    private static void signalSelf(String signal) {
        // Java has no kill(2): kill(1) on this JVM's own pid (a fork, milliseconds)
        String pid = Long.toString(ProcessHandle.current().pid());
        try {
            new ProcessBuilder("kill", "-" + signal, pid).inheritIO().start().waitFor();
        } catch (IOException | InterruptedException e) {
            Runtime.getRuntime().halt(137);  // cannot signal: die at once all the same
        }
    }

    /** The business logic: a card fee of 2.9 % + 30 cents (labkit.pipelines.ctp.transform;
     *  rint rounds half to even, as Python's round does). */
    public static byte[] transform(byte[] value) throws IOException {
        ObjectNode payment = (ObjectNode) json.readTree(value);
        long fee = (long) Math.rint(payment.get("amount_cents").asLong() * 0.029) + 30;
        payment.put("fee_cents", fee);
        return json.writeValueAsBytes(payment);
    }

    /** Told to stop (SIGTERM: a scale-down, a deploy)? Then finish the batch and close. */
    public static boolean stopping() {
        return stopping;
    }

    /** The loop as main() runs it: SIGTERM asks it to stop (it gets LEAVE_GRACE_S to close);
     *  what it raises is written to the run's history with its class, then exit 1. */
    public static void run(Loop loop) {
        endWithSupervisor();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping = true;
            try {
                ended.await(8, TimeUnit.SECONDS);  // the pool SIGKILLs after 10 s
            } catch (InterruptedException e) {
                // exiting anyway
            }
        }, "labkit-stop"));
        try {
            loop.run();
            ended.countDown();
        } catch (Throwable e) {
            raised(e);
            e.printStackTrace();
            System.err.flush();
            Runtime.getRuntime().halt(1);  // exit() would wait for the shutdown hook
        }
    }

    /** A loop never outlives the process that supervises it (labkit.faults.runner's
     *  rule): started from a supervisor's thread it gets no death signal, so once it is
     *  re-parented (that process died) it ends itself, as a SIGKILL would end it. */
    private static void endWithSupervisor() {
        long parent = ProcessHandle.current().parent().map(ProcessHandle::pid).orElse(-1L);
        Thread watch = new Thread(() -> {
            while (ProcessHandle.current().parent().map(ProcessHandle::pid).orElse(-1L) == parent) {
                try {
                    Thread.sleep(500);
                } catch (InterruptedException e) {
                    return;
                }
            }
            Runtime.getRuntime().halt(1);  // nobody is left to read it: no clean-up
        }, "labkit-supervisor-watch");
        watch.setDaemon(true);
        watch.start();
    }

    /** What the loop raised, as labkit.faults.runner.error_class writes a Python one's: the
     *  error's code and KIP-1050's class of it (fatal: this instance must stop; abortable:
     *  abort the transaction; retriable: the call may be repeated). */
    static void raised(Throwable e) {
        String history = System.getenv("LABKIT_HISTORY");
        if (history == null || history.isEmpty()) {
            return;
        }
        boolean abortable = false;
        for (Throwable t = e; t != null; t = t.getCause()) {
            abortable |= t instanceof TransactionAbortableException;
        }
        // An abort the producer refuses: kafka-clients' TransactionManager.beginAbort lets an
        // abortable state through and fails (maybeFailWithError) only in its fatal state, with
        // "Cannot execute transactional method because we are in an error state" caused by the
        // error that put it there (INVALID_TXN_STATE, an unexpected answer, an unknown producer
        // id mapping). Nothing is left for the instance but to stop: fatal, written with the
        // code of that cause (the outer KafkaException has none: UNKNOWN_SERVER_ERROR). A 4.4
        // broker answers INVALID_TXN_STATE to a commit that races its own fencing (KAFKA-20785:
        // the successor's initTransactions aborted it a moment before), so this is how a loop
        // fenced mid-commit can end.
        boolean refusedAbort = threwFrom(e, "maybeFailWithError") && threwFrom(e, "beginAbort");
        Throwable named = refusedAbort && e.getCause() != null ? e.getCause() : e;
        boolean fatal = refusedAbort || e instanceof ApplicationRecoverableException
            || e instanceof UnreleasedInstanceIdException || e instanceof AuthorizationException
            || e instanceof UnsupportedVersionException;
        String text = String.valueOf(e.getMessage());
        if (named != e) {
            text += " (caused by " + named.getClass().getSimpleName() + ": " + named.getMessage()
                + ")";
        }
        ObjectNode event = json.createObjectNode();
        event.put("t", System.currentTimeMillis() / 1000.0);  // seconds, as Python's time.time()
        event.put("kind", "raised");
        event.put("pid", ProcessHandle.current().pid());
        String instance = System.getenv("LABKIT_INSTANCE");
        if (instance == null || instance.isEmpty()) {
            event.putNull("instance");
        } else {
            event.put("instance", instance);
        }
        event.put("attempt", Integer.parseInt(System.getenv().getOrDefault("LABKIT_ATTEMPT", "1")));
        event.put("error", e.getClass().getSimpleName());
        event.put("text", text.substring(0, Math.min(400, text.length())));
        if (named instanceof KafkaException) {  // a Kafka error has a code and a class; any
            // other (an IllegalStateException) is written by its name, as a Python one is
            event.put("code", Errors.forException(named).name());
            event.put("fatal", fatal);
            event.put("retriable", e instanceof RetriableException);
            event.put("abortable", abortable && !fatal);
        }
        try (FileOutputStream out = new FileOutputStream(history, true)) {  // O_APPEND: one
            out.write((json.writeValueAsString(event) + "\n").getBytes(StandardCharsets.UTF_8));
        } catch (IOException ignored) {  // no history: nothing to tell
        }
    }

    /** Whether {@code e} was thrown inside kafka-clients' TransactionManager.{@code method}. */
    private static boolean threwFrom(Throwable e, String method) {
        for (StackTraceElement frame : e.getStackTrace()) {
            if (frame.getClassName().equals(TRANSACTION_MANAGER)
                && frame.getMethodName().equals(method)) {
                return true;
            }
        }
        return false;
    }
}
