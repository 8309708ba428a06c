//! Where the writer's group writes go: the one seam between the log and
//! the disk on the hot path.
//!
//! [`FileSystem`] is what the store runs on. The trait exists so a test
//! can put a file layer in its place that loses what was written but not
//! synced, as a power cut does (`tests/power_loss.rs`): every record a
//! reply depends on passes through [`GroupDisk::write_at`] and
//! [`GroupDisk::sync_data`]. What the writer does off the hot path
//! (creating segments, zeroing a torn tail at start, the dedup file) is
//! synced before anything depends on it and goes to the file system
//! directly.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The group writes of the log's writer thread.
pub trait GroupDisk: Send + Sync + std::fmt::Debug {
    /// Writes all of `buf` at `at` in segment `segment`, whose file is
    /// `file`.
    fn write_at(&self, segment: u64, file: &File, buf: &[u8], at: u64) -> io::Result<()>;

    /// Makes what was written to segment `segment` durable
    /// (`fdatasync`).
    fn sync_data(&self, segment: u64, file: &File) -> io::Result<()>;
}

/// The file system itself: `pwrite` and `fdatasync`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileSystem;

impl GroupDisk for FileSystem {
    fn write_at(&self, _segment: u64, file: &File, buf: &[u8], at: u64) -> io::Result<()> {
        file.write_all_at(buf, at)
    }

    fn sync_data(&self, _segment: u64, file: &File) -> io::Result<()> {
        file.sync_data()
    }
}
