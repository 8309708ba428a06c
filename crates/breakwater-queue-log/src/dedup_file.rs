//! The dedup file (`dedup.log`): the applied event ids (their 64-bit
//! hashes, and when each was applied) of segments already reclaimed, so a
//! restart still answers a redelivery within the dedup window with 200.
//!
//! It is framed like a segment (header with index 0, then
//! [`Record::Tombstones`] frames whose id is the next message id at that
//! moment, so ids never go back when every segment that held the highest
//! is gone). The writer appends one frame and syncs it before it deletes a
//! segment. At start it is read whole and rewritten with only what is
//! still within the window (a new file, synced, renamed over the old), and
//! again while running once it holds more than twice what is live.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::private;
use crate::record::{self, Record};
use crate::segment;

/// File name of the dedup file inside `[queue] path`.
pub(crate) const FILE_NAME: &str = "dedup.log";

/// What the file held.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub tombstones: Vec<(u64, i64)>,
    pub next_id: u64,
}

/// The open file, appended to by the writer.
#[derive(Debug)]
pub(crate) struct DedupFile {
    dir: PathBuf,
    file: File,
    end: u64,
    /// Tombstones written since it was last rewritten.
    pub entries: u64,
}

/// Reads the file in `dir`, if there is one. A damaged frame costs the
/// tombstones in it (a redelivery of those ids is queued again; the inbox
/// applies it once), never the file.
pub(crate) fn load(dir: &Path) -> Result<Loaded, segment::ScanError> {
    let path = dir.join(FILE_NAME);
    let mut loaded = Loaded::default();
    if !path.exists() {
        return Ok(loaded);
    }
    segment::scan_file(&path, 0, |_, next_id, r, _| {
        if let Record::Tombstones(entries) = r {
            loaded.next_id = loaded.next_id.max(next_id);
            loaded.tombstones.extend(entries);
        }
    })?;
    Ok(loaded)
}

impl DedupFile {
    /// Writes a new file holding `tombstones`, synced, in place of the old.
    pub(crate) fn rewrite(dir: &Path, tombstones: &[(u64, i64)], next_id: u64) -> io::Result<Self> {
        let tmp = dir.join(format!("{FILE_NAME}.tmp"));
        let mut buf = segment::header(0).to_vec();
        for chunk in tombstones.chunks(65_536) {
            record::put_record(
                &mut buf,
                next_id,
                &Record::Tombstones(chunk.to_vec()),
                record::NO_SALT,
            );
        }
        if tombstones.is_empty() {
            record::put_record(
                &mut buf,
                next_id,
                &Record::Tombstones(Vec::new()),
                record::NO_SALT,
            );
        }
        {
            // A stale `.tmp` (a crash mid-rewrite) keeps its mode through
            // a truncating open: remove it so the file is created 0600.
            match std::fs::remove_file(&tmp) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let f = private::options().write(true).create_new(true).open(&tmp)?;
            f.write_all_at(&buf, 0)?;
            f.sync_all()?;
        }
        let path = dir.join(FILE_NAME);
        std::fs::rename(&tmp, &path)?;
        File::open(dir)?.sync_all()?;
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        Ok(Self {
            dir: dir.to_owned(),
            file,
            end: buf.len() as u64,
            entries: tombstones.len() as u64,
        })
    }

    /// Appends `tombstones` (with the next message id) and syncs.
    pub(crate) fn append(&mut self, tombstones: Vec<(u64, i64)>, next_id: u64) -> io::Result<()> {
        let n = tombstones.len() as u64;
        let mut buf = Vec::with_capacity(tombstones.len() * 16 + record::HEADER);
        record::put_record(
            &mut buf,
            next_id,
            &Record::Tombstones(tombstones),
            record::NO_SALT,
        );
        self.file.write_all_at(&buf, self.end)?;
        self.file.sync_data()?;
        self.end += buf.len() as u64;
        self.entries += n;
        Ok(())
    }

    /// The directory it is in.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_and_the_next_id_survive_a_rewrite_and_appends() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load(dir.path()).expect("none yet").next_id, 0);
        let mut f = DedupFile::rewrite(dir.path(), &[(1, 10), (2, 20)], 5).expect("rewrite");
        f.append(vec![(3, 30)], 9).expect("append");
        let back = load(dir.path()).expect("load");
        assert_eq!(back.tombstones, vec![(1, 10), (2, 20), (3, 30)]);
        assert_eq!(back.next_id, 9);
        DedupFile::rewrite(dir.path(), &[(3, 30)], 9).expect("rewrite");
        let back = load(dir.path()).expect("load");
        assert_eq!((back.tombstones, back.next_id), (vec![(3, 30)], 9));
    }
}
