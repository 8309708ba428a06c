//! Segment files: naming, preallocation and reading back.
//!
//! A segment is `segment-<index>.log` in the store's directory: a 16-byte
//! header (`BWQLOG02` and the index, little-endian) and then frames
//! ([`crate::record`]) back to back, salted with the index. A segment is
//! written in place, never grown, so an `fdatasync` after an append has no
//! file size or new blocks to record, only the data. It is either
//! created at its full size, zeros written and synced ([`create`]; the
//! zeros after the last frame read as its end, [`FrameError::End`]), or
//! recycled from a settled segment ([`recycle`]: renamed, its header
//! rewritten), which costs no writing at all; there the frames of its
//! earlier life, salted with an older index, read as the end. A settled
//! segment may also wait as `free-<index>.log` ([`retire`]) to be reused
//! the same way later ([`reuse_free`]), and so may a blank one, zeros
//! only, made ahead while the writer idles ([`make_blank`],
//! [`reuse_blank`]). Segments of the first format
//! (`BWQLOG01`, unsalted) are read as they are.
//!
//! [`scan`] reads one back. A frame that is cut short or fails its
//! checksum ends the segment's data, unless its length is intact and a
//! valid frame follows it: then only that frame is bad (a flipped bit),
//! it is skipped and reported, and the rest is read. What lies after the
//! end (a torn tail: the last group, cut by a crash before its fsync) is
//! reported as [`Scanned::torn_bytes`]; the writer zeroes it before it
//! appends to the segment again.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::private;
use crate::record::{self, FrameError, Record};

/// The first bytes of every segment written now: frames salted with the
/// segment's index.
pub(crate) const MAGIC: &[u8; 8] = b"BWQLOG02";

/// The first bytes of a segment of the first format: frames unsalted.
pub(crate) const MAGIC_UNSALTED: &[u8; 8] = b"BWQLOG01";

/// Bytes of the header: the magic and the segment's index.
pub(crate) const HEADER_BYTES: u64 = 16;

/// Zeros written and synced at a time when preallocating: each sync puts
/// at most this much writeback in front of the group commits' own (under
/// `bench ingress --floor` at half load, requests over 5 ms were 2.5–2.9%
/// with paced 1 MiB pieces, 0.1–0.8% with these).
const ZEROS: usize = 256 << 10;

/// The file of segment `index` in `dir`.
pub(crate) fn path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("segment-{index:016}.log"))
}

/// The file of a settled segment kept for reuse ([`retire`]), by the
/// index it last had.
pub(crate) fn free_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("free-{index:016}.log"))
}

/// A blank segment made ahead ([`make_blank`]), by its number.
pub(crate) fn blank_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("blank-{number:016}.log"))
}

/// A blank segment still being zero-filled: never used, deleted at start.
fn blank_part_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("blank-{number:016}.part"))
}

/// The indexes of the segments in `dir`, oldest first.
pub(crate) fn list(dir: &Path) -> io::Result<Vec<u64>> {
    list_named(dir, "segment-")
}

/// The last indexes of the free segments in `dir`, oldest first.
pub(crate) fn list_free(dir: &Path) -> io::Result<Vec<u64>> {
    list_named(dir, "free-")
}

/// The numbers of the blank segments in `dir`, oldest first.
pub(crate) fn list_blank(dir: &Path) -> io::Result<Vec<u64>> {
    list_named(dir, "blank-")
}

/// Deletes the blank segments a stop or a crash cut short.
pub(crate) fn remove_blank_parts(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("blank-") && name.ends_with(".part") {
            std::fs::remove_file(dir.join(name))?;
        }
    }
    Ok(())
}

fn list_named(dir: &Path, prefix: &str) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(index) = name
            .strip_prefix(prefix)
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse().ok())
        {
            found.push(index);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// Creates segment `index` of `size` bytes: header, zeros, synced, and
/// the directory synced so the file survives a power cut.
///
/// The zeros are written and synced a chunk at a time: a segment made
/// ahead while the writer runs then never puts more than one chunk of
/// writeback in front of the writer's `fdatasync` (64 MiB synced at once
/// held group commits up for 100–200 ms under `bench ingress`).
pub(crate) fn create(dir: &Path, index: u64, size: u64) -> io::Result<File> {
    create_paced(dir, index, size, |_, _| Duration::ZERO)
}

/// [`create`], waiting `pace(how long the chunk took, chunks left)` after
/// each chunk of zeros ([`crate::pace`]).
pub(crate) fn create_paced(
    dir: &Path,
    index: u64,
    size: u64,
    mut pace: impl FnMut(Duration, u64) -> Duration,
) -> io::Result<File> {
    let path = path(dir, index);
    let file = private::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    file.write_all_at(&header(index), 0)?;
    zero_synced(&file, HEADER_BYTES, size, |took, left| {
        let wait = pace(took, left);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        true
    })?;
    file.sync_all()?;
    File::open(dir)?.sync_all()?;
    Ok(file)
}

/// Writes zeros over `[from, to)` of `file` a chunk ([`ZEROS`]) at a
/// time, each synced. After each chunk but the last, asks `next(how long
/// the chunk took, chunks left)` whether to go on; `Ok(false)` when it
/// said no.
fn zero_synced(
    file: &File,
    from: u64,
    to: u64,
    mut next: impl FnMut(Duration, u64) -> bool,
) -> io::Result<bool> {
    let mut at = from;
    while at < to {
        let started = Instant::now();
        let end = (at + ZEROS as u64).min(to);
        zero(file, at, end)?;
        file.sync_data()?;
        at = end;
        if at < to && !next(started.elapsed(), (to - at).div_ceil(ZEROS as u64)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Makes blank segment `number` of `size` bytes: zeros only, written and
/// synced a chunk at a time under a temporary name, then renamed, so a
/// blank that exists is whole. Asks `go_on` before each chunk, which
/// waits as long as it needs to and says whether to go on: when it says
/// no, the part written is deleted and the answer is `Ok(false)`. The
/// directory is synced by whatever renames next ([`reuse_blank`]
/// does before the blank is used); a power cut before that loses at most
/// the blank.
pub(crate) fn make_blank(
    dir: &Path,
    number: u64,
    size: u64,
    mut go_on: impl FnMut() -> bool,
) -> io::Result<bool> {
    let part = blank_part_path(dir, number);
    let made = (|| {
        let file = private::options()
            .write(true)
            .create_new(true)
            .open(&part)?;
        if !go_on() || !zero_synced(&file, 0, size, |_, _| go_on())? {
            return Ok(false);
        }
        file.sync_all()?;
        std::fs::rename(&part, blank_path(dir, number))?;
        Ok(true)
    })();
    if !matches!(made, Ok(true)) {
        let _ = std::fs::remove_file(&part);
    }
    made
}

/// The header of segment `index` (the dedup file's is index 0's).
pub(crate) fn header(index: u64) -> [u8; HEADER_BYTES as usize] {
    let mut header = [0u8; HEADER_BYTES as usize];
    header[..8].copy_from_slice(MAGIC);
    header[8..].copy_from_slice(&index.to_le_bytes());
    header
}

/// Makes settled segment `from` into segment `to` (a new index, after
/// every other), without writing its body: renamed (the directory synced,
/// so a power cut leaves either name, never both), then its header
/// rewritten and synced. Cut short between the two, the file is the
/// newest segment with an older index's header, read as
/// [`ScanError::Unfinished`] and dropped at start; its earlier life's
/// frames never read as data.
pub(crate) fn recycle(dir: &Path, from: u64, to: u64) -> io::Result<File> {
    reuse(dir, &path(dir, from), to)
}

/// Lets go of the page cache of `len` bytes of `file` from `offset`
/// (`POSIX_FADV_DONTNEED`): whole clean pages leave it, dirty ones are
/// written back first and stay.
pub(crate) fn let_go(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let Some(len) = std::num::NonZeroU64::new(len) else {
        return Ok(());
    };
    rustix::fs::fadvise(file, offset, Some(len), rustix::fs::Advice::DontNeed)?;
    Ok(())
}

/// Keeps settled segment `index` for reuse: renamed `free-<index>.log`,
/// which start-up does not read as a segment. The directory is synced by
/// whatever renames next ([`reuse`]); a power cut before that brings the
/// segment back under its own name, settled, as a crash before a delete
/// would.
pub(crate) fn retire(dir: &Path, index: u64) -> io::Result<()> {
    std::fs::rename(path(dir, index), free_path(dir, index))
}

/// Whether a file last used as segment `last` may become segment `next`:
/// its old frames must read as an earlier life ([`record::EARLIER_LIVES`],
/// half of it, for the lives before its last).
pub(crate) fn may_reuse(last: u64, next: u64) -> bool {
    last < next && next - last <= record::EARLIER_LIVES / 2
}

/// Makes free segment `from` ([`retire`]) into segment `to`, as
/// [`recycle`] does with a settled one.
pub(crate) fn reuse_free(dir: &Path, from: u64, to: u64) -> io::Result<File> {
    reuse(dir, &free_path(dir, from), to)
}

/// Makes blank segment `number` ([`make_blank`]) into segment `to`, as
/// [`recycle`] does with a settled one.
pub(crate) fn reuse_blank(dir: &Path, number: u64, to: u64) -> io::Result<File> {
    reuse(dir, &blank_path(dir, number), to)
}

fn reuse(dir: &Path, from: &Path, to: u64) -> io::Result<File> {
    std::fs::rename(from, path(dir, to))?;
    File::open(dir)?.sync_all()?;
    let file = open(dir, to)?;
    file.write_all_at(&header(to), 0)?;
    file.sync_data()?;
    Ok(file)
}

/// Bytes of each write of zeros: one page.
///
/// The page cache sizes a file's folios by the writes that fill it
/// (large folios, ext4 on Linux 6.18 here), and `fdatasync` writes back
/// each dirty folio whole. Zeros written a megabyte at a time made every
/// group commit afterwards, a few hundred bytes to a few dozen KiB, write
/// back a whole 1 MiB folio: 1,048,576 bytes per `fdatasync` against 4,530
/// for zeros written a page at a time (`/proc/self/io`, 438-byte appends).
pub(crate) const ZERO_WRITE: usize = 4096;

/// Writes zeros over `[from, to)`, a page at a time ([`ZERO_WRITE`]).
pub fn zero(file: &File, from: u64, to: u64) -> io::Result<()> {
    let zeros = [0u8; ZERO_WRITE];
    let mut at = from;
    while at < to {
        // The first piece ends on a page boundary.
        let n = (ZERO_WRITE as u64 - at % ZERO_WRITE as u64).min(to - at);
        file.write_all_at(&zeros[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

/// Opens an existing segment for reading and appending.
pub(crate) fn open(dir: &Path, index: u64) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path(dir, index))
}

/// A frame that failed its checksum in the middle of a segment's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Corrupt {
    pub offset: u64,
    pub error: FrameError,
}

/// What reading a segment found besides its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scanned {
    /// Where its data ends: the next frame goes here.
    pub end: u64,
    /// The segment's size on disk.
    pub size: u64,
    /// Non-zero bytes after `end`: a torn tail (or, in a segment that is
    /// not the last, data past a frame whose length was damaged).
    pub torn_bytes: u64,
    /// Frames skipped for a bad checksum, with valid frames after them.
    pub corrupt: Vec<Corrupt>,
    /// The salt its frames carry: [`record::salt`] of its index, or
    /// [`record::NO_SALT`] in a segment of the first format.
    pub salt: u32,
}

/// Why a segment could not be read at all.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScanError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a Breakwater log segment (its header is not {index}'s)")]
    NotASegment { path: PathBuf, index: u64 },
    /// Shorter than its header, or a header cut short with zeros after
    /// it: a segment whose creation a crash interrupted; or a whole header
    /// naming an older index: a recycling cut short between the rename and
    /// the new header. It was never written to (a segment is appended to
    /// only once made and synced).
    #[error("{path} is a segment whose creation was cut short")]
    Unfinished { path: PathBuf },
}

/// Reads segment `index` of `dir`, calling `visit(offset, id, record,
/// frame_len)` for each good frame in order.
pub(crate) fn scan(
    dir: &Path,
    index: u64,
    visit: impl FnMut(u64, u64, Record, usize),
) -> Result<Scanned, ScanError> {
    scan_file(&path(dir, index), index, visit)
}

/// Reads the file at `path`, framed as a segment whose header names
/// `index`.
pub(crate) fn scan_file(
    path: &Path,
    index: u64,
    mut visit: impl FnMut(u64, u64, Record, usize),
) -> Result<Scanned, ScanError> {
    let io = |source| ScanError::Io {
        path: path.to_owned(),
        source,
    };
    let mut buf = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut buf))
        .map_err(io)?;
    let expected = header(index);
    let mut unsalted = expected;
    unsalted[..8].copy_from_slice(MAGIC_UNSALTED);
    let head = &buf[..buf.len().min(HEADER_BYTES as usize)];
    let salt = if head == expected {
        record::salt(index)
    } else if head == unsalted {
        record::NO_SALT
    } else {
        let written = head.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        let cut_short =
            head[..written] == expected[..written] && buf[written..].iter().all(|&b| b == 0);
        let recycling_cut_short = head.len() == HEADER_BYTES as usize
            && (head[..8] == MAGIC[..] || head[..8] == MAGIC_UNSALTED[..])
            && u64::from_le_bytes(head[8..].try_into().unwrap_or_default()) < index;
        if cut_short || recycling_cut_short {
            return Err(ScanError::Unfinished {
                path: path.to_owned(),
            });
        }
        return Err(ScanError::NotASegment {
            path: path.to_owned(),
            index,
        });
    };
    Ok(scan_frames(&buf, index, salt, &mut visit))
}

/// Reads the frames of a whole segment held in `buf` (header included),
/// segment `index` whose frames carry `salt`.
fn scan_frames(
    buf: &[u8],
    index: u64,
    salt: u32,
    mut visit: impl FnMut(u64, u64, Record, usize),
) -> Scanned {
    let mut at = HEADER_BYTES as usize;
    let mut corrupt = Vec::new();
    while at < buf.len() {
        match record::decode(&buf[at..], salt) {
            Ok((id, record, n)) => {
                visit(at as u64, id, record, n);
                at += n;
            }
            Err(FrameError::End | FrameError::Truncated) => break,
            Err(error @ (FrameError::Checksum | FrameError::Malformed)) => {
                // With its length intact and a good frame after it, only
                // this frame is bad: skip it. Otherwise the data ends here.
                let next = record::frame_len(&buf[at..])
                    .ok()
                    .map(|n| at + n)
                    .filter(|&next| {
                        buf.get(next..)
                            .is_some_and(|rest| record::decode(rest, salt).is_ok())
                    });
                match next {
                    Some(next) => {
                        corrupt.push(Corrupt {
                            offset: at as u64,
                            error,
                        });
                        at = next;
                    }
                    None => break,
                }
            }
        }
    }
    let end = at.min(buf.len());
    // A recycled segment's data ends at a whole frame of its earlier
    // life: a clean end. (In a first-format segment nothing is recycled.)
    let clean_end = salt != record::NO_SALT && record::earlier_life(&buf[end..], index);
    let torn_bytes = if clean_end {
        0
    } else {
        buf[end..]
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |p| p + 1)
    };
    Scanned {
        end: end as u64,
        size: buf.len() as u64,
        torn_bytes: torn_bytes as u64,
        corrupt,
        salt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::message;

    /// A segment of `n` enqueues, as bytes, and where each frame starts.
    fn segment_of(n: u64) -> (Vec<u8>, Vec<usize>) {
        let mut buf = Vec::new();
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&7u64.to_le_bytes());
        let mut starts = Vec::new();
        for id in 1..=n {
            starts.push(buf.len());
            let m = Record::Enqueue(message(&format!("e{id}")));
            record::put_record(&mut buf, id, &m, record::salt(7));
        }
        (buf, starts)
    }

    fn ids(buf: &[u8]) -> (Vec<u64>, Scanned) {
        let mut ids = Vec::new();
        let scanned = scan_frames(buf, 7, record::salt(7), |_, id, _, _| ids.push(id));
        (ids, scanned)
    }

    #[test]
    fn a_tail_cut_at_every_byte_of_the_last_frames_reads_as_the_frames_before() {
        let (buf, starts) = segment_of(4);
        // The last group: the last two frames.
        let group = starts[2];
        for cut in group..buf.len() {
            // Frame i (id i + 1) ends where frame i + 1 starts.
            let ends: Vec<usize> = starts.iter().skip(1).copied().chain([buf.len()]).collect();
            let complete: Vec<u64> = (1..=4u64)
                .filter(|&id| ends[id as usize - 1] <= cut)
                .collect();
            let end = starts.get(complete.len()).copied().unwrap_or(buf.len());
            // Cut at EOF, and cut with zeros after it (preallocated).
            let mut zeroed = buf[..cut].to_vec();
            zeroed.resize(buf.len() + 4096, 0);
            for bytes in [&buf[..cut], &zeroed[..]] {
                let (got, scanned) = ids(bytes);
                assert_eq!(got, complete, "cut at {cut}");
                assert_eq!(scanned.end as usize, end, "cut at {cut}");
                assert!(scanned.corrupt.is_empty(), "cut at {cut}");
                // What was written of the cut frames, up to its last non-zero byte.
                let torn = buf[end..cut]
                    .iter()
                    .rposition(|&b| b != 0)
                    .map_or(0, |p| p + 1);
                assert_eq!(scanned.torn_bytes as usize, torn, "cut at {cut}");
            }
        }
    }

    #[test]
    fn a_flipped_bit_mid_segment_skips_that_frame_and_reads_the_rest() {
        let (mut buf, starts) = segment_of(5);
        buf[starts[2] + 30] ^= 0x10;
        let (got, scanned) = ids(&buf);
        assert_eq!(got, vec![1, 2, 4, 5]);
        assert_eq!(
            scanned.corrupt,
            vec![Corrupt {
                offset: starts[2] as u64,
                error: FrameError::Checksum
            }]
        );
        assert_eq!(scanned.end as usize, buf.len());
        assert_eq!(scanned.torn_bytes, 0);
    }

    #[test]
    fn a_segment_whose_creation_was_cut_short_reads_as_unfinished_not_as_foreign() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&5u64.to_le_bytes());
        let cut_short: [Vec<u8>; 4] = [
            Vec::new(),
            header[..3].to_vec(),
            [&header[..8], &[0u8; 100][..]].concat(),
            vec![0u8; 4096],
        ];
        for bytes in cut_short {
            std::fs::write(path(dir.path(), 5), &bytes).expect("write");
            assert!(
                matches!(
                    scan(dir.path(), 5, |_, _, _, _| {}),
                    Err(ScanError::Unfinished { .. })
                ),
                "{bytes:?}"
            );
        }
        for foreign in [
            b"BWQLOG03".to_vec(),
            [&header[..], b"x"].concat()[1..].to_vec(),
        ] {
            std::fs::write(path(dir.path(), 5), &foreign).expect("write");
            assert!(matches!(
                scan(dir.path(), 5, |_, _, _, _| {}),
                Err(ScanError::NotASegment { .. })
            ));
        }
    }

    #[test]
    fn a_segment_is_created_zeroed_listed_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = create(dir.path(), 3, 64 << 10).expect("create");
        let mut frame = Vec::new();
        record::put_record(&mut frame, 11, &Record::Ack, record::salt(3));
        file.write_all_at(&frame, HEADER_BYTES).expect("write");
        create(dir.path(), 12, 4096).expect("create");
        assert_eq!(list(dir.path()).expect("list"), vec![3, 12]);
        let mut seen = Vec::new();
        let scanned = scan(dir.path(), 3, |o, id, r, _| seen.push((o, id, r))).expect("scan");
        assert_eq!(seen, vec![(HEADER_BYTES, 11, Record::Ack)]);
        assert_eq!(scanned.end, HEADER_BYTES + frame.len() as u64);
        assert_eq!(scanned.size, 64 << 10);
        // Renamed without its header: to a later index, a recycling cut
        // short; to an earlier one, nothing of ours.
        std::fs::rename(path(dir.path(), 12), path(dir.path(), 13)).expect("rename");
        assert!(matches!(
            scan(dir.path(), 13, |_, _, _, _| {}),
            Err(ScanError::Unfinished { .. })
        ));
        std::fs::rename(path(dir.path(), 13), path(dir.path(), 11)).expect("rename");
        assert!(matches!(
            scan(dir.path(), 11, |_, _, _, _| {}),
            Err(ScanError::NotASegment { index: 11, .. })
        ));
    }

    #[test]
    fn a_recycled_segment_reads_its_new_frames_and_ends_cleanly_at_its_earlier_life() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = create(dir.path(), 4, 64 << 10).expect("create");
        let mut frames = Vec::new();
        for id in 1..=50 {
            let m = Record::Enqueue(message(&format!("old{id}")));
            record::put_record(&mut frames, id, &m, record::salt(4));
        }
        old.write_all_at(&frames, HEADER_BYTES).expect("write");
        drop(old);

        let new = recycle(dir.path(), 4, 9).expect("recycle");
        assert_eq!(list(dir.path()).expect("list"), vec![9]);
        // Empty: the earlier life's first frame is where its data ends.
        let scanned = scan(dir.path(), 9, |_, id, _, _| panic!("read {id}")).expect("scan");
        assert_eq!((scanned.end, scanned.torn_bytes), (HEADER_BYTES, 0));
        assert_eq!(scanned.salt, record::salt(9));

        // Two new frames, shorter than the old ones they overwrite.
        let mut fresh = Vec::new();
        record::put_record(&mut fresh, 100, &Record::Ack, record::salt(9));
        record::put_record(&mut fresh, 101, &Record::Ack, record::salt(9));
        new.write_all_at(&fresh, HEADER_BYTES).expect("write");
        let mut seen = Vec::new();
        let scanned = scan(dir.path(), 9, |_, id, _, _| seen.push(id)).expect("scan");
        assert_eq!(seen, vec![100, 101]);
        assert_eq!(scanned.end, HEADER_BYTES + fresh.len() as u64);
        // What follows is the remains of an old frame, then whole old
        // frames: the remains are not a whole frame of any life, so they
        // read as a torn tail (zeroed at start, as after a crash).
        assert!(scanned.torn_bytes > 0);
        assert!(scanned.corrupt.is_empty());

        // A new frame exactly as long as the first old one: the old
        // second frame follows it whole, a clean end.
        let mut same_length = Vec::new();
        let m = Record::Enqueue(message("new1"));
        record::put_record(&mut same_length, 300, &m, record::salt(9));
        new.write_all_at(&same_length, HEADER_BYTES).expect("write");
        let mut seen = Vec::new();
        let scanned = scan(dir.path(), 9, |_, id, _, _| seen.push(id)).expect("scan");
        assert_eq!(seen, vec![300]);
        assert_eq!(scanned.end, HEADER_BYTES + same_length.len() as u64);
        assert_eq!(scanned.torn_bytes, 0);
    }

    #[test]
    fn a_first_format_segment_reads_unsalted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut buf = MAGIC_UNSALTED.to_vec();
        buf.extend_from_slice(&5u64.to_le_bytes());
        record::put_record(&mut buf, 3, &Record::Ack, record::NO_SALT);
        buf.resize(4096, 0);
        std::fs::write(path(dir.path(), 5), &buf).expect("write");
        let mut seen = Vec::new();
        let scanned = scan(dir.path(), 5, |_, id, r, _| seen.push((id, r))).expect("scan");
        assert_eq!(seen, vec![(3, Record::Ack)]);
        assert_eq!((scanned.salt, scanned.torn_bytes), (record::NO_SALT, 0));
    }
}
