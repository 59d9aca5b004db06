package riverhouse.json;

import java.util.List;
import java.util.Map;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.catalyst.expressions.objects.StaticInvoke;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.ObjectType;
import org.apache.spark.sql.types.StructType;
import scala.collection.immutable.Seq;
import scala.runtime.BoxedUnit;

/**
 * Riverhouse's Spark session extension ({@code spark.sql.extensions}, next to Delta's; set by
 * runtime/jars.py when this jar was built): four SQL functions,
 * {@code riverhouse_from_json(text, schema_json, options_json)}, Spark's {@code from_json} reading
 * the record's UTF-8 bytes ({@link FromJsonBytes}), {@code riverhouse_json_sure(text)}, the
 * one-pass strict check over them ({@link StrictJson}), and {@code riverhouse_plain_timestamp(text)},
 * the instant of a timestamp in the plain ISO 8601 form, NULL for any other text
 * ({@link PlainTimestamp}), and {@code riverhouse_repeated_key(text)}, the first top-level key given
 * twice ({@link RepeatedKey}). The schema is a {@code StructType}'s JSON, the
 * options a JSON object of strings, both literals; the time zone and the corrupt-record column's
 * default name are the session's, as for {@code from_json}. The expression is an {@code Invoke} of
 * the evaluator, as Spark plans {@code from_json} itself, so it runs in generated code.
 */
public final class Extensions implements scala.Function1<SparkSessionExtensions, BoxedUnit> {
    public static final String FROM_JSON = "riverhouse_from_json";
    public static final String JSON_SURE = "riverhouse_json_sure";
    public static final String PLAIN_TIMESTAMP = "riverhouse_plain_timestamp";
    public static final String REPEATED_KEY = "riverhouse_repeated_key";

    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        inject(extensions, FROM_JSON, Extensions::fromJson);
        inject(extensions, JSON_SURE, Extensions::jsonSure);
        inject(extensions, PLAIN_TIMESTAMP, Extensions::plainTimestamp);
        inject(extensions, REPEATED_KEY, Extensions::repeatedKey);
        return BoxedUnit.UNIT;
    }

    private static void inject(
            SparkSessionExtensions extensions, String name, scala.Function1<Seq<Expression>, Expression> builder) {
        ExpressionInfo info = new ExpressionInfo(Extensions.class.getName(), null, name);
        extensions.injectFunction(new scala.Tuple3<>(FunctionIdentifier.apply(name), info, builder));
    }

    /** {@code riverhouse_json_sure(text)}: {@link StrictJson#sure}, NULL for NULL; deterministic, in generated code. */
    static Expression jsonSure(Seq<Expression> arguments) {
        return ofText(JSON_SURE, arguments, StrictJson.class, "sure", DataTypes.BooleanType, false);
    }

    /** {@code riverhouse_plain_timestamp(text)}: {@link PlainTimestamp#micros}, a timestamp or NULL. */
    static Expression plainTimestamp(Seq<Expression> arguments) {
        return ofText(PLAIN_TIMESTAMP, arguments, PlainTimestamp.class, "micros", DataTypes.TimestampType, true);
    }

    /** {@code riverhouse_repeated_key(text)}: {@link RepeatedKey#first}, a string or NULL. */
    static Expression repeatedKey(Seq<Expression> arguments) {
        return ofText(REPEATED_KEY, arguments, RepeatedKey.class, "first", DataTypes.StringType, true);
    }

    /**
     * {@code name(text)}: a deterministic {@code StaticInvoke} of {@code cls.method(UTF8String)}, in generated
     * code; NULL for NULL, and for NULL from the method when {@code returnsNull}.
     */
    private static Expression ofText(
            String name, Seq<Expression> arguments, Class<?> cls, String method, DataType type, boolean returnsNull) {
        if (arguments.length() != 1) {
            throw new IllegalArgumentException(name + "(text) takes 1 argument, got " + arguments.length());
        }
        return new StaticInvoke(
            cls, type, method, seq(arguments.apply(0)), noTypeCheck(), true, returnsNull, true, scala.Option.empty());
    }

    static Expression fromJson(Seq<Expression> arguments) {
        if (arguments.length() != 3) {
            throw new IllegalArgumentException(FROM_JSON + "(text, schema_json, options_json) takes 3 arguments, got "
                + arguments.length());
        }
        StructType schema = (StructType) DataType.fromJson(literal(arguments.apply(1), "schema_json"));
        StructType nullable = schema.asNullable();
        SQLConf conf = SQLConf.get();
        FromJsonBytes evaluator = new FromJsonBytes(
            nullable, options(literal(arguments.apply(2), "options_json")), conf.sessionLocalTimeZone(),
            conf.columnNameOfCorruptRecord());
        return new Invoke(
            new Literal(evaluator, new ObjectType(FromJsonBytes.class)), "evaluate", nullable, seq(arguments.apply(0)),
            noTypeCheck(), true, true, true);
    }

    private static Seq<Expression> seq(Expression argument) {
        return scala.jdk.javaapi.CollectionConverters.asScala(List.of(argument)).toList();
    }

    /** No input types: the argument is the record's text (a string), as the parse builds it. */
    @SuppressWarnings("unchecked")
    private static Seq<AbstractDataType> noTypeCheck() {
        return (Seq<AbstractDataType>) (Object) scala.collection.immutable.Nil$.MODULE$;
    }

    private static String literal(Expression argument, String name) {
        if (!argument.foldable()) {
            throw new IllegalArgumentException(FROM_JSON + ": " + name + " must be a string literal");
        }
        Object value = argument.eval(null);
        if (value == null) {
            throw new IllegalArgumentException(FROM_JSON + ": " + name + " must not be NULL");
        }
        return value.toString();
    }

    @SuppressWarnings("unchecked")
    private static Map<String, String> options(String json) {
        try {
            return new com.fasterxml.jackson.databind.ObjectMapper().readValue(json, Map.class);
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException(FROM_JSON + ": options_json is not a JSON object of strings", e);
        }
    }
}
