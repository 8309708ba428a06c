//! Who may read the store: its owner only. Segments, `dedup.log`,
//! `dlq.db` (and the `-wal` and `-shm` files SQLite makes beside it, with
//! the main file's mode) hold whole payloads, so every file the store
//! creates is created `0600` and every folder `0700`, whatever the umask
//! (the mode is given at creation, so a file is never readable by others,
//! not even for a moment).
//!
//! The queue's own folder (`[queue] path`) is made `0700` at every open,
//! also when it already existed: it holds nothing but the store, and that
//! also closes the files an older release left readable (`0644`). A
//! parent folder Breakwater creates on the way is `0700`; one that
//! already existed is left as its owner made it.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every file the store creates.
pub(crate) const FILE_MODE: u32 = 0o600;

/// Mode of every folder the store creates, and of its own folder.
pub(crate) const DIR_MODE: u32 = 0o700;

/// Options that create a file [`FILE_MODE`].
pub(crate) fn options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(FILE_MODE);
    options
}

/// Creates `dir` (and the parents missing) [`DIR_MODE`], and makes `dir`
/// itself [`DIR_MODE`] if it existed with more.
pub(crate) fn own_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))?;
        tracing::info!(path = %dir.display(), was = %format!("{:o}", mode & 0o777),
            "the queue's folder was readable by others: made it 0700");
    }
    Ok(())
}

/// Creates `path` empty, [`FILE_MODE`], unless it exists: a file SQLite
/// then opens keeps that mode, and gives it to its `-wal` and `-shm`.
pub(crate) fn create_file(path: &Path) -> io::Result<()> {
    match options().write(true).create_new(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn the_queue_folder_is_made_private_and_an_existing_parent_left_alone() {
        let root = tempfile::tempdir().expect("tempdir");
        let parent = root.path().join("mine");
        std::fs::create_dir(&parent).expect("mkdir");
        std::fs::set_permissions(&parent, Permissions::from_mode(0o755)).expect("chmod");
        let dir = parent.join("made").join("queue");
        own_dir(&dir).expect("own_dir");
        assert_eq!(mode(&parent), 0o755, "a folder the user made is theirs");
        assert_eq!(mode(&parent.join("made")), DIR_MODE);
        assert_eq!(mode(&dir), DIR_MODE);

        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).expect("chmod");
        own_dir(&dir).expect("own_dir again");
        assert_eq!(
            mode(&dir),
            DIR_MODE,
            "the queue's own folder, even if it existed"
        );
    }

    #[test]
    fn a_file_is_created_private_and_an_existing_one_kept() {
        let root = tempfile::tempdir().expect("tempdir");
        let path = root.path().join("f");
        create_file(&path).expect("create");
        assert_eq!(mode(&path), FILE_MODE);
        std::fs::write(&path, b"kept").expect("write");
        create_file(&path).expect("exists");
        assert_eq!(std::fs::read(&path).expect("read"), b"kept");
    }
}
