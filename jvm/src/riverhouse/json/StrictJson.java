package riverhouse.json;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadFeature;
import java.nio.ByteBuffer;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * One strict pass over a record's JSON text, called from Spark SQL as {@code riverhouse_json_sure}
 * (registered by {@link Extensions}; src/riverhouse/platform/ingest/parse.py, {@code _surely_strict}).
 *
 * <p>It answers true only for text that Spark's strict parse ({@code try_parse_json}, a variant) is
 * sure to accept as one JSON value and nothing after it: Jackson with its default (strict)
 * features, no key given twice in any object, no text after the value. It answers false (the
 * variant decides) for all it is not sure of: any backslash escape (an unpaired surrogate
 * hides in one), a number too large for a long or a finite double, nesting deeper than 64, text over
 * 1,000,000 bytes, and anything Jackson refuses (NaN and Infinity among them, which the
 * variant's path reads in its own way).
 */
public final class StrictJson {
    private static final JsonFactory FACTORY =
        JsonFactory.builder().enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION).build();
    private static final int MAX_CHARS = 1_000_000;
    private static final int MAX_DEPTH = 64;

    private StrictJson() {}

    /**
     * The answer for a record's UTF-8 text (valid UTF-8: the parse checks that first), read from its
     * bytes. More than MAX_CHARS bytes, or a text Jackson's encoding detection could take for
     * another encoding than UTF-8 (a zero byte among the first four, a byte order mark), is doubted.
     */
    public static boolean sure(UTF8String text) {
        if (text == null || text.numBytes() > MAX_CHARS || !FromJsonBytes.onlyUtf8ToTheDetector(text)) {
            return false;
        }
        ByteBuffer bytes = text.getByteBuffer();
        byte[] array = bytes.array();
        int start = bytes.arrayOffset() + bytes.position();
        int end = start + bytes.remaining();
        for (int i = start; i < end; i++) {
            if (array[i] == '\\') {
                return false;
            }
        }
        try (JsonParser parser = FACTORY.createParser(array, start, end - start)) {
            return surely(parser);
        } catch (Exception e) { // Jackson refused the text (a key twice among its reasons)
            return false;
        }
    }

    private static boolean surely(JsonParser parser) throws java.io.IOException {
        JsonToken token = parser.nextToken();
        int depth = 0;
        while (token != null) {
            switch (token) {
                case START_OBJECT:
                case START_ARRAY:
                    if (++depth > MAX_DEPTH) {
                        return false;
                    }
                    break;
                case END_OBJECT:
                case END_ARRAY:
                    depth--;
                    break;
                case VALUE_NUMBER_INT:
                    if (parser.getNumberType() == JsonParser.NumberType.BIG_INTEGER) {
                        return false;
                    }
                    break;
                case VALUE_NUMBER_FLOAT:
                    if (!Double.isFinite(parser.getDoubleValue())) {
                        return false;
                    }
                    break;
                default:
                    break;
            }
            if (depth == 0) {
                return parser.nextToken() == null; // one value, then only whitespace
            }
            token = parser.nextToken();
        }
        return false;
    }
}
