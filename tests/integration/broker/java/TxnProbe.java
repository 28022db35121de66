import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Drives the Java Kafka client against a broker: create a topic, commit one transaction and abort
 * another, then read the topic with read_committed and read_uncommitted consumers and commit the
 * read_committed consumer's position in a group. Prints one line per fact for the Python test:
 *
 *   created TOPIC
 *   committed OFFSET                       (per record of the committed transaction, from its send future)
 *   aborted
 *   read_committed VALUE ... / read_uncommitted VALUE ...
 *   end_offset N / group_offset N
 *
 * Usage: java TxnProbe BOOTSTRAP TOPIC [CLIENT_PROPERTIES_FILE]
 *
 * The optional file's properties (security.protocol, ssl.truststore.* ...) go to every client.
 */
public final class TxnProbe {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        Properties common = new Properties();
        if (args.length > 2) {
            try (java.io.FileReader reader = new java.io.FileReader(args[2])) {
                common.load(reader);
            }
        }
        TopicPartition partition = new TopicPartition(topic, 0);

        Properties adminProps = new Properties();
        adminProps.putAll(common);
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
            System.out.println("created " + topic);
        }

        Properties producerProps = new Properties();
        producerProps.putAll(common);
        producerProps.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        producerProps.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "java-probe-" + topic);
        producerProps.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        producerProps.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps)) {
            producer.initTransactions();
            producer.beginTransaction();
            List<java.util.concurrent.Future<org.apache.kafka.clients.producer.RecordMetadata>> sent =
                    new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, 0, "k" + i, "committed-" + i)));
            }
            producer.commitTransaction();
            for (var future : sent) {
                System.out.println("committed " + future.get().offset());
            }
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(topic, 0, "k-aborted", "aborted-0"));
            producer.flush();
            producer.abortTransaction();
            System.out.println("aborted");
        }

        for (String isolation : List.of("read_committed", "read_uncommitted")) {
            Properties consumerProps = new Properties();
            consumerProps.putAll(common);
            consumerProps.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, "java-probe-" + isolation + "-" + topic);
            consumerProps.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
            consumerProps.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            consumerProps.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            consumerProps.put(
                    ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerProps)) {
                consumer.assign(List.of(partition));
                consumer.seekToBeginning(List.of(partition));
                long end = consumer.endOffsets(List.of(partition)).get(partition);
                List<String> values = new ArrayList<>();
                long deadline = System.currentTimeMillis() + 20_000;
                while (consumer.position(partition) < end && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                        values.add(record.value());
                    }
                }
                System.out.println(isolation + " " + String.join(" ", values));
                if (isolation.equals("read_committed")) {
                    System.out.println("end_offset " + end);
                    consumer.commitSync(Map.of(partition, new OffsetAndMetadata(consumer.position(partition))));
                    OffsetAndMetadata committed = consumer.committed(Collections.singleton(partition)).get(partition);
                    System.out.println("group_offset " + committed.offset());
                }
            }
        }
    }
}
