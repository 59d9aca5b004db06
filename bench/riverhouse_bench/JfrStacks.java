// Prints a Java Flight Recorder recording's CPU samples, GC pauses and long compilations as
// tab-separated lines (one event a line) for riverhouse_bench.jfr. Run by the JDK's source
// launcher, no build: `java JfrStacks.java <recording.jfr> <max frames> [<from ms> <to ms>]`
// (epoch milliseconds: only events that started in that window).
//   S <thread's Java name> <frame;frame;...>   jdk.ExecutionSample, top frame first, Class.method
//   G <collector> <sum of pauses ns> <longest pause ns>   jdk.GarbageCollection
//   C <duration ns>                            jdk.Compilation
// `jfr print --json` writes ~160 KB per sample (every frame's class, loader and module): this
// streams the same events through the JDK's public reader (jdk.jfr.consumer) in a few bytes each.
import java.io.BufferedOutputStream;
import java.io.PrintStream;
import java.nio.file.Path;
import java.time.Instant;
import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedFrame;
import jdk.jfr.consumer.RecordedStackTrace;
import jdk.jfr.consumer.RecordedThread;
import jdk.jfr.consumer.RecordingFile;

public class JfrStacks {
    public static void main(String[] args) throws Exception {
        int depth = Integer.parseInt(args[1]);
        Instant from = args.length > 3 ? Instant.ofEpochMilli(Long.parseLong(args[2])) : Instant.MIN;
        Instant to = args.length > 3 ? Instant.ofEpochMilli(Long.parseLong(args[3])) : Instant.MAX;
        PrintStream out = new PrintStream(new BufferedOutputStream(System.out, 1 << 16), false);
        StringBuilder line = new StringBuilder();
        try (RecordingFile recording = new RecordingFile(Path.of(args[0]))) {
            while (recording.hasMoreEvents()) {
                RecordedEvent event = recording.readEvent();
                if (event.getStartTime().isBefore(from) || event.getStartTime().isAfter(to)) {
                    continue;
                }
                String type = event.getEventType().getName();
                if (type.equals("jdk.ExecutionSample")) {
                    RecordedThread thread = event.getThread("sampledThread");
                    line.setLength(0);
                    line.append("S\t").append(clean(thread == null ? null : thread.getJavaName())).append('\t');
                    RecordedStackTrace stack = event.getStackTrace();
                    int n = 0;
                    for (RecordedFrame frame : stack == null ? java.util.List.<RecordedFrame>of() : stack.getFrames()) {
                        if (n++ == depth) {
                            break;
                        }
                        if (n > 1) {
                            line.append(';');
                        }
                        line.append(clean(frame.getMethod().getType().getName())).append('.');
                        line.append(clean(frame.getMethod().getName()));
                    }
                    out.println(line);
                } else if (type.equals("jdk.GarbageCollection")) {
                    out.println("G\t" + clean(event.getString("name")) + "\t"
                            + event.getDuration("sumOfPauses").toNanos() + "\t"
                            + event.getDuration("longestPause").toNanos());
                } else if (type.equals("jdk.Compilation")) {
                    out.println("C\t" + event.getDuration().toNanos());
                }
            }
        }
        out.flush();
    }

    private static String clean(String text) {
        return text == null ? "?" : text.replace('\t', ' ').replace('\n', ' ').replace(';', ',');
    }
}
