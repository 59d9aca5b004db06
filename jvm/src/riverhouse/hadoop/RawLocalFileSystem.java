package riverhouse.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system without a child process per new file.
 *
 * <p>Without Hadoop's native library, {@code RawLocalFileSystem.setPermission} runs {@code chmod}
 * in a child process, and every file Spark creates (each Parquet file a task writes) sets its
 * permission. This sets it through {@code java.nio} instead: the same mode, no process.
 * Permissions NIO cannot express (sticky bit) still go through Hadoop's own code.
 */
public class RawLocalFileSystem extends org.apache.hadoop.fs.RawLocalFileSystem {
  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    String mode = permission.toString();
    if (mode.length() != 9 || !mode.matches("[rwx-]{9}")) {
      super.setPermission(p, permission);
      return;
    }
    try {
      Files.setPosixFilePermissions(pathToFile(p).toPath(), PosixFilePermissions.fromString(mode));
    } catch (UnsupportedOperationException e) { // not a POSIX file system
      super.setPermission(p, permission);
    }
  }
}
