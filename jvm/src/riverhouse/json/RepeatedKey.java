package riverhouse.json;

import org.apache.spark.sql.catalyst.expressions.json.JsonExpressionUtils;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The first top-level key a record gives twice, called from Spark SQL as
 * {@code riverhouse_repeated_key} (registered by {@link Extensions};
 * src/riverhouse/platform/ingest/parse.py, {@code _duplicate_key}).
 *
 * <p>The keys are Spark's own {@code json_object_keys} (NULL for text that is not a JSON object), and
 * the answer is the first of them that appears again, as the parse's SQL form
 * {@code filter(keys, k -> size(filter(keys, o -> o = k)) > 1)[1]} gives it. That form is a
 * higher-order function, which has no generated code and so keeps the whole record-rules projection
 * out of whole-stage code; this one is a {@code StaticInvoke}, in it
 * (tests/spark/test_repeated_key.py compares the two).
 */
public final class RepeatedKey {
    private RepeatedKey() {}

    public static UTF8String first(UTF8String text) {
        ArrayData keys = text == null ? null : JsonExpressionUtils.jsonObjectKeys(text);
        if (keys == null) {
            return null;
        }
        int n = keys.numElements();
        for (int i = 0; i < n; i++) {
            UTF8String key = keys.getUTF8String(i);
            for (int j = 0; j < n; j++) {
                if (j != i && key.equals(keys.getUTF8String(j))) {
                    return key;
                }
            }
        }
        return null;
    }
}
