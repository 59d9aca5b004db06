package riverhouse.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;

/**
 * The {@code file:} scheme's {@code AbstractFileSystem} (setting
 * {@code fs.AbstractFileSystem.file.impl}): Hadoop's checksummed {@code LocalFs} over
 * {@link RawLocalFs}, whose rename is atomic and starts no process.
 */
public class LocalFs extends ChecksumFs {
  public LocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(new RawLocalFs(uri, conf));
  }
}
