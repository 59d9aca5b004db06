package riverhouse.json;

import java.nio.ByteBuffer;
import java.time.DateTimeException;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The instant of a timestamp written in the one plain form producers send, called from Spark SQL as
 * {@code riverhouse_plain_timestamp} (registered by {@link Extensions};
 * src/riverhouse/platform/ingest/parse.py, {@code _typed}).
 *
 * <p>The form: {@code YYYY-MM-DD}, {@code T} or a space, {@code HH:MM:SS}, optionally {@code .} and
 * 1 to 9 digits, then {@code Z} or an offset {@code +HH:MM}/{@code -HH:MM}; nothing around it. For
 * such a text the parse's timestamp rules (it starts with a date, it is not epoch digits, it ends in
 * no zone abbreviation) hold, and the value is Spark's own cast: the same fields, the fraction
 * truncated to microseconds, the offset applied. Every other text, and a text of this form that
 * names no real date or time (February 30th, 24:00, an offset beyond 18 hours), gets NULL: the
 * parse's rules, in Spark SQL, then decide about it. So this only spares the common case two
 * regular expressions, four substrings and Spark's zone lookup (a regular expression too);
 * tests/spark/test_plain_timestamp.py compares it with Spark's cast.
 */
public final class PlainTimestamp {
    private static final int SHORTEST = "2026-01-01T00:00:00Z".length();
    private static final int LONGEST = "2026-01-01T00:00:00.123456789+00:00".length();

    private PlainTimestamp() {}

    /** Microseconds since 1970-01-01T00:00:00Z, or NULL when the text is not of the plain form. */
    public static Long micros(UTF8String text) {
        if (text == null) {
            return null;
        }
        int length = text.numBytes();
        if (length < SHORTEST || length > LONGEST) {
            return null;
        }
        ByteBuffer buffer = text.getByteBuffer();
        byte[] b = buffer.array();
        int s = buffer.arrayOffset() + buffer.position();
        int end = s + length;
        int year = digits(b, s, 4);
        int month = digits(b, s + 5, 2);
        int day = digits(b, s + 8, 2);
        int hour = digits(b, s + 11, 2);
        int minute = digits(b, s + 14, 2);
        int second = digits(b, s + 17, 2);
        if ((year | month | day | hour | minute | second) < 0
            || b[s + 4] != '-' || b[s + 7] != '-' || (b[s + 10] != 'T' && b[s + 10] != ' ')
            || b[s + 13] != ':' || b[s + 16] != ':') {
            return null;
        }
        int i = s + 19;
        int nanos = 0;
        if (b[i] == '.') {
            int scale = 100_000_000;
            int first = ++i;
            while (i < end && b[i] >= '0' && b[i] <= '9') {
                nanos += (b[i] - '0') * scale;
                scale /= 10;
                i++;
            }
            if (i == first || i - first > 9) {
                return null;
            }
        }
        ZoneOffset offset;
        if (i == end - 1 && b[i] == 'Z') {
            offset = ZoneOffset.UTC;
        } else if (i == end - 6 && (b[i] == '+' || b[i] == '-') && b[i + 3] == ':') {
            int hours = digits(b, i + 1, 2);
            int minutes = digits(b, i + 4, 2);
            if ((hours | minutes) < 0) {
                return null;
            }
            int sign = b[i] == '-' ? -1 : 1;
            try {
                offset = ZoneOffset.ofHoursMinutes(sign * hours, sign * minutes);
            } catch (DateTimeException e) { // beyond 18 hours, or 60 minutes or more
                return null;
            }
        } else {
            return null;
        }
        try {
            LocalDateTime local = LocalDateTime.of(year, month, day, hour, minute, second, nanos);
            // Spark keeps microseconds: the nanoseconds' last three digits are dropped, as its cast does.
            return local.toEpochSecond(offset) * 1_000_000L + nanos / 1_000;
        } catch (DateTimeException e) { // no such date or time
            return null;
        }
    }

    /** The number written by `count` ASCII digits at `at`, or -1 when one of them is not a digit. */
    private static int digits(byte[] b, int at, int count) {
        int value = 0;
        for (int i = at; i < at + count; i++) {
            int digit = b[i] - '0';
            if (digit < 0 || digit > 9) {
                return -1;
            }
            value = value * 10 + digit;
        }
        return value;
    }
}
