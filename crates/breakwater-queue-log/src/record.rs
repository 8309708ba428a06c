//! The log's records and their framing: pure encoding and decoding, no I/O.
//!
//! Every record is framed `length | crc32c | type | id | payload | end`:
//!
//! | field | bytes | meaning |
//! |---|---|---|
//! | length | 4, LE | bytes of `type`, `id` and `payload` (never 0: a 0 is the zeroed end of a segment) |
//! | crc32c | 4, LE | CRC-32C (Castagnoli) of `type`, `payload` and `id`, in that order, XORed with the segment's [`salt`] |
//! | type | 1 | [`Kind`] |
//! | id | 8, LE | the message the record is about |
//! | payload | length - 9 | the kind's fields, below |
//! | end | 1 | [`END`] (0xB7) |
//!
//! The end byte makes a frame cut anywhere and followed by zeros (a
//! preallocated segment) never read as whole, even when the bytes it lost
//! were zeros themselves (as the high bytes of a timestamp are).
//!
//! Payload fields are little-endian integers and length-prefixed (u32)
//! byte strings. An [`Kind::Enqueue`] holds the message as the ingress
//! gave it; a [`Kind::Carry`] holds a live message with its state
//! (attempts, replays, when it is visible): one copied forward out of a
//! segment about to be reclaimed, or one replayed out of the dead-letter
//! queue. Retry and release hold when the message is visible again; ack
//! and dead-letter (the message has moved to the DLQ store) hold nothing.
//! Claims are not logged: leases live in memory, and after a crash every
//! lease has lapsed (delivery stays at-least-once).
//!
//! The salt ties a frame to the segment it was written in. Settled
//! segments are recycled as the next segment (renamed, a new header
//! written) instead of zero-filling a new file, so a recycled segment
//! holds the frames of its earlier life after its new data: salted with
//! another index, they fail the checksum and read as the end of the data
//! ([`earlier_life`] tells them from a torn write). Segments of the first
//! format (`BWQLOG01`), and the dedup file, use the salt 0: the checksum
//! alone.
//!
//! The payload of an enqueue is encoded, and its checksum taken, on the
//! caller's thread ([`EncodedMessage`]); the writer only adds the header
//! with the id it assigns and runs the checksum on over the id's 8 bytes.
//! That is why the id comes last in the checksum though not in the frame
//! (combining checksums instead, `crc32c_combine`, cost the writer about
//! 15 us per webhook).

use bytes::Bytes;

/// Bytes of a frame besides its payload: length, crc, type, id, end.
pub(crate) const HEADER: usize = 4 + 4 + 1 + 8 + 1;

/// The last byte of every frame.
pub(crate) const END: u8 = 0xB7;

/// The part of a frame its length counts besides the payload.
const TYPE_AND_ID: usize = 1 + 8;

/// A record's type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Enqueue = 1,
    Carry = 2,
    Ack = 3,
    Retry = 4,
    Release = 5,
    DeadLetter = 6,
    Tombstones = 7,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Enqueue,
            2 => Self::Carry,
            3 => Self::Ack,
            4 => Self::Retry,
            5 => Self::Release,
            6 => Self::DeadLetter,
            7 => Self::Tombstones,
            _ => return None,
        })
    }
}

/// A message as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredMessage {
    pub source: String,
    pub event_id: String,
    pub entity_key: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub received_at_ms: i64,
}

impl StoredMessage {
    /// Its key in the dedup index.
    pub(crate) fn dedup_hash(&self) -> u64 {
        crate::dedup_hash(&self.source, &self.event_id)
    }
}

/// A live message's state, as a [`Kind::Carry`] record copies it forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CarriedState {
    pub attempts: u32,
    pub replays: u32,
    pub visible_at_ms: i64,
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    Enqueue(StoredMessage),
    Carry(StoredMessage, CarriedState),
    Ack,
    /// A failed attempt: visible again at `visible_at_ms`.
    Retry {
        visible_at_ms: i64,
    },
    /// Handed back untried: visible again at `visible_at_ms`.
    Release {
        visible_at_ms: i64,
    },
    /// Moved to the dead-letter store: settled here.
    DeadLetter,
    /// Dedup hashes of applied event ids and when each was applied (the
    /// dedup file's records; their id is the next message id then).
    Tombstones(Vec<(u64, i64)>),
}

impl Record {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Self::Enqueue(_) => Kind::Enqueue,
            Self::Carry(..) => Kind::Carry,
            Self::Ack => Kind::Ack,
            Self::Retry { .. } => Kind::Retry,
            Self::Release { .. } => Kind::Release,
            Self::DeadLetter => Kind::DeadLetter,
            Self::Tombstones(_) => Kind::Tombstones,
        }
    }
}

/// Why bytes did not decode as a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// A zero length: the zeroed, unwritten rest of a segment.
    #[error("end of written data")]
    End,
    /// Fewer bytes than the frame says it has: a write cut short.
    #[error("frame cut short")]
    Truncated,
    /// The checksum does not match: a torn write or a flipped bit.
    #[error("checksum mismatch")]
    Checksum,
    /// The checksum matches but the payload does not parse: written by
    /// something else, or a bug.
    #[error("malformed record")]
    Malformed,
}

/// The salt of segment `index`'s frames: the index's low 32 bits times an
/// odd constant, so no two of 2^32 consecutive indexes share one, and
/// [`NO_SALT`] is index 0's.
pub(crate) fn salt(index: u64) -> u32 {
    (index as u32).wrapping_mul(SALT_FACTOR)
}

/// The salt of the first segment format and of the dedup file.
pub(crate) const NO_SALT: u32 = 0;

/// Odd, so multiplying by it is a bijection of `u32`.
const SALT_FACTOR: u32 = 0x9E37_79B1;
/// `SALT_FACTOR`'s inverse modulo 2^32.
const SALT_INVERSE: u32 = 0x0E8B_2F51;

/// Of the segment indexes whose salt is `salt`, the one at most 2^32 - 1
/// below `index`'s.
fn salted_index(salt: u32, index: u64) -> u64 {
    let low = salt.wrapping_mul(SALT_INVERSE);
    let back = (index as u32).wrapping_sub(low);
    index.wrapping_sub(u64::from(back))
}

/// Recycled segments a frame's earlier life may lie this far back, at
/// most; a damaged frame whose checksum happens to match another salt
/// within it reads as a clean end, 1 in 65,536 damaged frames.
pub(crate) const EARLIER_LIVES: u64 = 1 << 16;

/// Whether `buf` starts with a whole frame written in an earlier life of
/// segment `index`'s file (salted with the index of a segment before it,
/// or with [`NO_SALT`]): not data, and not a torn write either.
pub(crate) fn earlier_life(buf: &[u8], index: u64) -> bool {
    let Some((stored, computed)) = frame_checksums(buf) else {
        return false;
    };
    let salt = stored ^ computed;
    if salt == NO_SALT {
        return true;
    }
    let earlier = salted_index(salt, index);
    earlier < index && index - earlier <= EARLIER_LIVES
}

/// The stored and the computed checksum (unsalted) of the whole frame at
/// the start of `buf`, if it is whole: its length there and its end byte.
fn frame_checksums(buf: &[u8]) -> Option<(u32, u32)> {
    let total = frame_len(buf).ok()?;
    let frame = buf.get(..total)?;
    let (&end, frame) = frame.split_last()?;
    if end != END {
        return None;
    }
    let stored = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let body = &frame[8..];
    let before_id = crc32c::crc32c_append(crc32c::crc32c(&body[..1]), &body[TYPE_AND_ID..]);
    Some((stored, checksum(before_id, &body[1..TYPE_AND_ID])))
}

/// An enqueue's payload, encoded with its checksum on the caller's thread.
#[derive(Debug, Clone)]
pub(crate) struct EncodedMessage {
    pub payload: Vec<u8>,
    pub crc: u32,
}

impl EncodedMessage {
    pub(crate) fn new(message: &StoredMessage) -> Self {
        let mut payload = Vec::with_capacity(message_len(message));
        put_message(&mut payload, message);
        let crc = checksum_before_id(Kind::Enqueue, &payload);
        Self { payload, crc }
    }

    /// Bytes of the whole frame.
    pub(crate) fn frame_len(&self) -> usize {
        HEADER + self.payload.len()
    }
}

/// Appends the frame of an enqueue of `id` to `out`, salted with `salt`.
pub(crate) fn put_enqueue(out: &mut Vec<u8>, id: u64, message: &EncodedMessage, salt: u32) {
    put_frame(
        out,
        Kind::Enqueue,
        id,
        &message.payload,
        Some(message.crc),
        salt,
    );
}

/// Appends the frame of `record` about message `id` to `out`, salted with
/// `salt`.
pub(crate) fn put_record(out: &mut Vec<u8>, id: u64, record: &Record, salt: u32) {
    let mut payload = Vec::new();
    match record {
        Record::Enqueue(m) => put_message(&mut payload, m),
        Record::Carry(m, s) => {
            put_message(&mut payload, m);
            put_u32(&mut payload, s.attempts);
            put_u32(&mut payload, s.replays);
            put_i64(&mut payload, s.visible_at_ms);
        }
        Record::Ack | Record::DeadLetter => {}
        Record::Tombstones(entries) => {
            for &(hash, at) in entries {
                payload.extend_from_slice(&hash.to_le_bytes());
                put_i64(&mut payload, at);
            }
        }
        Record::Retry { visible_at_ms } | Record::Release { visible_at_ms } => {
            put_i64(&mut payload, *visible_at_ms);
        }
    }
    put_frame(out, record.kind(), id, &payload, None, salt);
}

/// Salts a whole frame made with [`NO_SALT`] (for the segment it lands in
/// once there is room for it).
pub(crate) fn salt_frame(frame: &mut [u8], salt: u32) {
    if let Some(crc) = frame.get_mut(4..8) {
        let salted = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) ^ salt;
        crc.copy_from_slice(&salted.to_le_bytes());
    }
}

/// The checksum of a frame's type and payload, to be run on over its id.
fn checksum_before_id(kind: Kind, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&[kind as u8]), payload)
}

/// `before_id` ([`checksum_before_id`]) run on over the id.
fn checksum(before_id: u32, id: &[u8]) -> u32 {
    crc32c::crc32c_append(before_id, id)
}

fn put_frame(
    out: &mut Vec<u8>,
    kind: Kind,
    id: u64,
    payload: &[u8],
    before_id: Option<u32>,
    salt: u32,
) {
    let mut head = [0u8; TYPE_AND_ID];
    head[0] = kind as u8;
    head[1..].copy_from_slice(&id.to_le_bytes());
    let before_id = before_id.unwrap_or_else(|| checksum_before_id(kind, payload));
    let crc = checksum(before_id, &head[1..]) ^ salt;
    let len = u32::try_from(TYPE_AND_ID + payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
    out.push(END);
}

/// How many bytes the frame starting at `buf[0]` says it spans, if its
/// length field is there and non-zero.
pub(crate) fn frame_len(buf: &[u8]) -> Result<usize, FrameError> {
    let len = buf
        .get(..4)
        .ok_or(FrameError::Truncated)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)?;
    if len == 0 {
        // Every written frame has at least its type and id.
        return Err(FrameError::End);
    }
    if len < TYPE_AND_ID {
        return Err(FrameError::Checksum);
    }
    Ok(8 + len + 1)
}

/// Decodes the frame at the start of `buf`, salted with `salt`: its id,
/// its record and the bytes it spans.
pub(crate) fn decode(buf: &[u8], salt: u32) -> Result<(u64, Record, usize), FrameError> {
    let total = frame_len(buf)?;
    buf.get(..total).ok_or(FrameError::Truncated)?;
    let (stored, computed) = frame_checksums(buf).ok_or(FrameError::Checksum)?;
    if stored != computed ^ salt {
        return Err(FrameError::Checksum);
    }
    let body = &buf[8..total - 1];
    let kind = Kind::from_byte(body[0]).ok_or(FrameError::Malformed)?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&body[1..TYPE_AND_ID]);
    let mut r = Reader(&body[TYPE_AND_ID..]);
    let record = match kind {
        Kind::Enqueue => Record::Enqueue(r.message()?),
        Kind::Carry => {
            let m = r.message()?;
            let state = CarriedState {
                attempts: r.u32()?,
                replays: r.u32()?,
                visible_at_ms: r.i64()?,
            };
            Record::Carry(m, state)
        }
        Kind::Ack => Record::Ack,
        Kind::DeadLetter => Record::DeadLetter,
        Kind::Tombstones => {
            let mut entries = Vec::with_capacity(r.0.len() / 16);
            while !r.0.is_empty() {
                let hash = r.i64()?.cast_unsigned();
                entries.push((hash, r.i64()?));
            }
            Record::Tombstones(entries)
        }
        Kind::Retry => Record::Retry {
            visible_at_ms: r.i64()?,
        },
        Kind::Release => Record::Release {
            visible_at_ms: r.i64()?,
        },
    };
    if !r.0.is_empty() {
        return Err(FrameError::Malformed);
    }
    Ok((u64::from_le_bytes(id), record, total))
}

/// A message's fields alone, as the dead-letter store keeps them.
pub(crate) fn encode_message(m: &StoredMessage) -> Vec<u8> {
    let mut out = Vec::with_capacity(message_len(m));
    put_message(&mut out, m);
    out
}

/// Reads back what [`encode_message`] wrote.
pub(crate) fn decode_message(buf: &[u8]) -> Result<StoredMessage, FrameError> {
    let mut r = Reader(buf);
    let m = r.message()?;
    if r.0.is_empty() {
        Ok(m)
    } else {
        Err(FrameError::Malformed)
    }
}

fn message_len(m: &StoredMessage) -> usize {
    let strings = m.source.len()
        + m.event_id.len()
        + m.entity_key.as_ref().map_or(0, String::len)
        + m.headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>();
    strings + m.body.len() + 4 * 5 + 1 + 8
}

fn put_message(out: &mut Vec<u8>, m: &StoredMessage) {
    put_str(out, &m.source);
    put_str(out, &m.event_id);
    match &m.entity_key {
        None => out.push(0),
        Some(k) => {
            out.push(1);
            put_str(out, k);
        }
    }
    put_u32(out, u32::try_from(m.headers.len()).unwrap_or(u32::MAX));
    for (k, v) in &m.headers {
        put_str(out, k);
        put_str(out, v);
    }
    put_bytes(out, &m.body);
    put_i64(out, m.received_at_ms);
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, u32::try_from(b.len()).unwrap_or(u32::MAX));
    out.extend_from_slice(b);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

/// Reads a payload front to back; every read past its end is
/// [`FrameError::Malformed`].
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.0.len() < n {
            return Err(FrameError::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&mut self) -> Result<i64, FrameError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(i64::from_le_bytes(a))
    }

    fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, FrameError> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_owned)
            .map_err(|_| FrameError::Malformed)
    }

    fn message(&mut self) -> Result<StoredMessage, FrameError> {
        let source = self.string()?;
        let event_id = self.string()?;
        let entity_key = match self.u8()? {
            0 => None,
            _ => Some(self.string()?),
        };
        let n = self.u32()? as usize;
        let mut headers = Vec::with_capacity(n.min(256));
        for _ in 0..n {
            headers.push((self.string()?, self.string()?));
        }
        let body = Bytes::copy_from_slice(self.bytes()?);
        let received_at_ms = self.i64()?;
        Ok(StoredMessage {
            source,
            event_id,
            entity_key,
            headers,
            body,
            received_at_ms,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn message(event: &str) -> StoredMessage {
        StoredMessage {
            source: "stripe".into(),
            event_id: event.into(),
            entity_key: Some("order-7".into()),
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from_static(b"{\"id\":7}"),
            received_at_ms: 1_700_000_000_000,
        }
    }

    fn every_kind() -> Vec<Record> {
        vec![
            Record::Enqueue(message("e1")),
            Record::Carry(
                StoredMessage {
                    entity_key: None,
                    headers: vec![],
                    ..message("e2")
                },
                CarriedState {
                    attempts: 3,
                    replays: 1,
                    visible_at_ms: 99,
                },
            ),
            Record::Ack,
            Record::Retry { visible_at_ms: 12 },
            Record::Release { visible_at_ms: -1 },
            Record::DeadLetter,
            Record::Tombstones(vec![(u64::MAX, 5), (3, -1)]),
        ]
    }

    #[test]
    fn every_kind_decodes_as_it_was_encoded() {
        for (i, record) in every_kind().into_iter().enumerate() {
            let mut buf = Vec::new();
            put_record(&mut buf, i as u64 + 1000, &record, NO_SALT);
            let (id, back, used) = decode(&buf, NO_SALT).expect("decodes");
            assert_eq!((id, &back, used), (i as u64 + 1000, &record, buf.len()));
        }
    }

    #[test]
    fn an_enqueue_checksummed_on_the_callers_thread_is_a_valid_frame() {
        let m = message("e1");
        let encoded = EncodedMessage::new(&m);
        let mut fast = Vec::new();
        put_enqueue(&mut fast, 42, &encoded, NO_SALT);
        let mut plain = Vec::new();
        put_record(&mut plain, 42, &Record::Enqueue(m.clone()), NO_SALT);
        assert_eq!(fast, plain);
        assert_eq!(encoded.frame_len(), fast.len());
        assert_eq!(
            decode(&fast, NO_SALT).expect("decodes").1,
            Record::Enqueue(m)
        );
    }

    #[test]
    fn every_cut_of_a_frame_is_refused_and_never_read_as_data() {
        let mut buf = Vec::new();
        put_record(&mut buf, 1, &Record::Enqueue(message("e1")), NO_SALT);
        for cut in 0..buf.len() {
            let got = decode(&buf[..cut], NO_SALT);
            assert!(
                matches!(got, Err(FrameError::Truncated)),
                "cut at {cut}: {got:?}"
            );
            // The same cut followed by zeros, as in a preallocated segment.
            let mut zeroed = buf[..cut].to_vec();
            zeroed.resize(buf.len() + 64, 0);
            let got = decode(&zeroed, NO_SALT);
            assert!(got.is_err(), "cut at {cut} then zeros: {got:?}");
        }
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let mut buf = Vec::new();
        put_record(&mut buf, 9, &Record::Enqueue(message("e1")), NO_SALT);
        for byte in 4..buf.len() {
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[byte] ^= 1 << bit;
                assert_eq!(
                    decode(&bad, NO_SALT).map(|(id, r, _)| (id, r)),
                    Err(FrameError::Checksum),
                    "byte {byte} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn a_frame_salted_for_one_segment_fails_in_another_and_reads_as_its_earlier_life() {
        let mut buf = Vec::new();
        put_record(&mut buf, 7, &Record::Enqueue(message("e1")), salt(41));
        assert!(decode(&buf, salt(41)).is_ok());
        for other in [0, 40, 42, 41 + (1 << 32)] {
            if salt(other) != salt(41) {
                assert_eq!(
                    decode(&buf, salt(other)).map(|d| d.0),
                    Err(FrameError::Checksum)
                );
            }
        }
        // Segment 41's file recycled as segment 50, or 41 + 65,536: an
        // earlier life. Not as 41 itself, nor a segment before it.
        assert!(earlier_life(&buf, 50));
        assert!(earlier_life(&buf, 41 + EARLIER_LIVES));
        assert!(!earlier_life(&buf, 41 + EARLIER_LIVES + 1));
        assert!(!earlier_life(&buf, 41));
        assert!(!earlier_life(&buf, 30));
        // A first-format frame is an earlier life of any segment.
        let mut legacy = Vec::new();
        put_record(&mut legacy, 7, &Record::Ack, NO_SALT);
        assert!(earlier_life(&legacy, 3));
        // A torn frame is not.
        let mut torn = buf.clone();
        torn[30] ^= 1;
        assert!(!earlier_life(&torn, 50));
        assert!(!earlier_life(&buf[..buf.len() - 1], 50));
    }

    #[test]
    fn the_salt_inverse_undoes_the_salt() {
        assert_eq!(SALT_FACTOR.wrapping_mul(SALT_INVERSE), 1);
        for index in [1u64, 2, 41, 1 << 31, (1 << 32) + 5, u64::MAX] {
            assert_eq!(salted_index(salt(index), index), index);
            assert_eq!(salted_index(salt(index - 1), index), index - 1);
        }
    }

    #[test]
    fn a_message_alone_reads_back() {
        let m = message("e1");
        assert_eq!(decode_message(&encode_message(&m)), Ok(m));
    }

    #[test]
    fn a_zero_length_is_the_end_of_the_written_data() {
        assert_eq!(decode(&[0u8; 64], NO_SALT), Err(FrameError::End));
    }
}
