package riverhouse.hadoop;

/**
 * The {@code file:} scheme's {@code FileSystem} (setting {@code fs.file.impl}): Hadoop's
 * checksummed local file system over {@link RawLocalFileSystem}.
 */
public class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {
  public LocalFileSystem() {
    super(new RawLocalFileSystem());
  }
}
