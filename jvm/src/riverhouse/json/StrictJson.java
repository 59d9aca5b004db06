package riverhouse.json;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadFeature;

/**
 * One strict pass over a record's JSON text, called from Spark SQL with {@code reflect}
 * (src/riverhouse/platform/ingest/parse.py, {@code _surely_strict}).
 *
 * <p>It answers "y" only for text that Spark's strict parse ({@code try_parse_json}, a variant) is
 * sure to accept as one JSON value and nothing after it: Jackson with its default (strict)
 * features, no key given twice in any object, no text after the value. It answers "n" (the
 * variant decides) for all it is not sure of: any backslash escape (an unpaired surrogate
 * hides in one), a number too large for a long or a finite double, nesting deeper than 64, text over
 * 1,000,000 characters, and anything Jackson refuses (NaN and Infinity among them, which the
 * variant's path reads in its own way).
 */
public final class StrictJson {
    private static final JsonFactory FACTORY =
        JsonFactory.builder().enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION).build();
    private static final int MAX_CHARS = 1_000_000;
    private static final int MAX_DEPTH = 64;

    private StrictJson() {}

    public static String doubt(String text) {
        return surely(text) ? "y" : "n";
    }

    static boolean surely(String text) {
        if (text == null || text.length() > MAX_CHARS || text.indexOf('\\') >= 0) {
            return false;
        }
        try (JsonParser parser = FACTORY.createParser(text)) {
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
        } catch (Exception e) { // Jackson refused the text (a key twice among its reasons)
            return false;
        }
    }
}
