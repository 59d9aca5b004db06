package riverhouse.json;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.Map;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.ExprUtils;
import org.apache.spark.sql.catalyst.json.CreateJacksonParser;
import org.apache.spark.sql.catalyst.json.JSONOptions;
import org.apache.spark.sql.catalyst.json.JacksonParser;
import org.apache.spark.sql.catalyst.util.FailFastMode$;
import org.apache.spark.sql.catalyst.util.FailureSafeParser;
import org.apache.spark.sql.catalyst.util.ParseMode;
import org.apache.spark.sql.catalyst.util.PermissiveMode$;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Spark's {@code from_json} into a struct, with Jackson reading the record's UTF-8 bytes.
 *
 * <p>Spark's own {@code from_json} ({@code JsonToStructsEvaluator}) reads each record through an
 * {@code InputStreamReader}, whose decoder allocates an 8 KB buffer per record, and Jackson's
 * reader-based parser. This evaluator is the same code (Spark's {@code JacksonParser} and
 * {@code FailureSafeParser}, the same options, schema and corrupt-record column) with one change:
 * the parser reads the record's bytes as a stream, Jackson's UTF-8 parser. The caller gives it valid
 * UTF-8 only (ingest/parse.py checks {@code is_valid_utf8} first). Jackson then detects the
 * encoding from the first four bytes: a record whose first four bytes hold a zero byte (UTF-16 or
 * UTF-32 to the detector) or that starts with a UTF-8 byte order mark (which the byte parser would
 * skip and the reader would not) goes through Spark's reader, as in {@code from_json}. So every
 * record gets the row {@code from_json} gives it (tests/spark/test_from_json_bytes.py checks that
 * on hostile records). Registered as {@code riverhouse_from_json} by {@link Extensions}.
 */
public final class FromJsonBytes implements Serializable {
    private static final long serialVersionUID = 1L;

    private final StructType schema;
    private final Map<String, String> options;
    private final String timeZoneId;
    private final String nameOfCorruptRecord;
    private transient FailureSafeParser<UTF8String> parser;

    public FromJsonBytes(StructType schema, Map<String, String> options, String timeZoneId, String nameOfCorruptRecord) {
        this.schema = schema;
        this.options = Map.copyOf(options);
        this.timeZoneId = timeZoneId;
        this.nameOfCorruptRecord = nameOfCorruptRecord;
    }

    /** The record's row, as {@code from_json(json, schema, options)} gives it; NULL for NULL. */
    public InternalRow evaluate(UTF8String json) {
        if (json == null) {
            return null;
        }
        if (parser == null) {
            parser = newParser();
        }
        scala.collection.Iterator<InternalRow> rows = parser.parse(json);
        return rows.hasNext() ? rows.next() : null;
    }

    @SuppressWarnings("unchecked")
    private FailureSafeParser<UTF8String> newParser() {
        scala.collection.immutable.Map<String, String> scalaOptions = (scala.collection.immutable.Map<String, String>)
            scala.collection.immutable.Map$.MODULE$.from(scala.jdk.javaapi.CollectionConverters.asScala(options));
        JSONOptions parsed = new JSONOptions(scalaOptions, timeZoneId, nameOfCorruptRecord);
        ParseMode mode = parsed.parseMode();
        if (mode != PermissiveMode$.MODULE$ && mode != FailFastMode$.MODULE$) {
            throw new IllegalArgumentException("riverhouse_from_json supports the PERMISSIVE and FAILFAST modes only");
        }
        String corrupt = parsed.columnNameOfCorruptRecord();
        ExprUtils.verifyColumnNameOfCorruptRecord(schema, corrupt);
        StructType actual = new StructType(
            java.util.Arrays.stream(schema.fields()).filter(f -> !f.name().equals(corrupt)).toArray(StructField[]::new));
        JacksonParser raw = new JacksonParser(
            actual, parsed, false, (scala.collection.immutable.Seq<org.apache.spark.sql.sources.Filter>)
                (Object) scala.collection.immutable.Nil$.MODULE$);
        scala.Function2<JsonFactory, UTF8String, JsonParser> bytes = FromJsonBytes::createParser;
        scala.Function2<JsonFactory, UTF8String, JsonParser> reader = CreateJacksonParser::utf8String;
        scala.Function1<UTF8String, UTF8String> literal = record -> record;
        return new FailureSafeParser<>(input -> parse(raw, input, bytes, reader, literal), mode, schema, corrupt);
    }

    /**
     * The record's rows, read from its bytes; a record the bytes parser refuses is read again as
     * from_json reads it, so that what Spark makes of a broken record (its fields read before the
     * error, the corrupt-record column) is from_json's: Jackson's two parsers stop at different
     * places in broken text, and the UTF-8 one refuses a key with an unpaired surrogate escape.
     */
    private static scala.collection.Iterable<InternalRow> parse(
            JacksonParser raw, UTF8String input, scala.Function2<JsonFactory, UTF8String, JsonParser> bytes,
            scala.Function2<JsonFactory, UTF8String, JsonParser> reader, scala.Function1<UTF8String, UTF8String> literal) {
        try {
            return raw.parse(input, bytes, literal);
        } catch (Exception e) { // Spark's BadRecordException and PartialResultException are checked ones
            return raw.parse(input, reader, literal);
        }
    }

    /** Jackson's UTF-8 parser over the bytes where its encoding detection can only find UTF-8. */
    static JsonParser createParser(JsonFactory factory, UTF8String record) {
        if (!onlyUtf8ToTheDetector(record)) {
            return CreateJacksonParser.utf8String(factory, record);
        }
        // An InputStream, not the array itself: given an array, Spark's parser reads a string field's
        // non-string value (a number, an object) as its exact text; from_json's reader makes it
        // JSON again. The stream keeps from_json's behaviour, and Jackson's buffers are recycled.
        ByteBuffer bytes = record.getByteBuffer();
        InputStream stream = new ByteArrayInputStream(bytes.array(), bytes.arrayOffset() + bytes.position(), bytes.remaining());
        try {
            return factory.createParser(stream);
        } catch (IOException e) {
            throw new UncheckedIOException(e); // a bad record: `parse` reads it again through the reader
        }
    }

    /** Four bytes or more, none of the first four zero, no UTF-8 byte order mark. */
    static boolean onlyUtf8ToTheDetector(UTF8String record) {
        if (record.numBytes() < 4) {
            return false;
        }
        for (int i = 0; i < 4; i++) {
            if (record.getByte(i) == 0) {
                return false;
            }
        }
        return record.getByte(0) != (byte) 0xEF;
    }
}
