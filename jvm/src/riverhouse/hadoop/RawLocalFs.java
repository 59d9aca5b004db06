package riverhouse.hadoop;

import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * Hadoop's {@code RawLocalFs} (the {@code file:} scheme under {@code FileContext}) with a rename
 * that is atomic and starts no process.
 *
 * <p>Spark's streaming checkpoint and Delta's log on a local disk commit a file by renaming a
 * temporary file to its final name, refusing to replace one that exists (the mutual exclusion
 * of two writers of one version). Hadoop's generic rename checks both paths' link status first;
 * without Hadoop's native library each check runs {@code readlink} in a child process, and the
 * check and the rename are two steps. Here the final name is made with {@code link(2)}, which
 * fails if the name exists, then the temporary name is removed: one atomic step, no process.
 * Cases outside a plain file's commit (directories, file systems without hard links) keep
 * Hadoop's own code.
 */
public class RawLocalFs extends DelegateToFileSystem {
  public RawLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(uri, new RawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
  }

  @Override
  public int getUriDefaultPort() {
    return -1;
  }

  @Override
  @Deprecated
  public FsServerDefaults getServerDefaults() throws IOException {
    return LocalConfigKeys.getServerDefaults();
  }

  @Override
  public FsServerDefaults getServerDefaults(Path f) throws IOException {
    return LocalConfigKeys.getServerDefaults();
  }

  @Override
  public boolean isValidName(String src) {
    return true;
  }

  @Override
  public void renameInternal(Path src, Path dst, boolean overwrite) throws IOException {
    RawLocalFileSystem raw = (RawLocalFileSystem) fsImpl;
    File from = raw.pathToFile(src);
    File to = raw.pathToFile(dst);
    if (!from.isFile() || to.isDirectory()) {
      super.renameInternal(src, dst, overwrite);
      return;
    }
    try {
      if (overwrite) {
        Files.move(from.toPath(), to.toPath(), StandardCopyOption.ATOMIC_MOVE);
        return;
      }
      Files.createLink(to.toPath(), from.toPath());
    } catch (FileAlreadyExistsException e) {
      throw new org.apache.hadoop.fs.FileAlreadyExistsException("rename destination " + dst + " already exists.");
    } catch (NoSuchFileException e) {
      throw new FileNotFoundException("rename of " + src + " to " + dst + ": " + e.getMessage() + " does not exist");
    } catch (IOException | UnsupportedOperationException e) { // no hard links on this file system
      super.renameInternal(src, dst, overwrite);
      return;
    }
    Files.delete(from.toPath());
  }
}
