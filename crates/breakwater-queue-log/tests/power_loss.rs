//! Power loss, simulated: the writer's group writes go through a file
//! layer ([`PowerCut`]) that remembers what was written but not yet
//! synced. At a random write or sync, the power goes: the layer copies the
//! store as it stands, undoes a random half of the unsynced sectors in the
//! copy (in reverse order, 512 bytes at a time: some of the page cache
//! reached the disk, some did not), and fails every later call. The copy
//! is then opened as the machine would find it after the restart.
//!
//! Each cycle runs producers and a consumer (acks and releases) on
//! 64 KiB segments, so groups are cut mid-write, between write and sync,
//! across segment rolls, reclaims and carries. After each cut, on the copy:
//! every enqueue that was answered `New` and not acked is queued, with its
//! body intact; every answered event id still answers `Duplicate`; and
//! nothing that was never sent appears. `POWER_LOSS_SEED` replays a run.
//!
//! What this does not model: a deleted segment coming back because its
//! directory entry was not synced (the writer does not sync the directory
//! after a reclaim; a segment that comes back holds only settled
//! messages, whose acks may be lost with it: delivered again, at least
//! once), and the SQLite dead-letter store, which syncs on its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_queue::{Enqueued, NewMessage, Queue, QueueError};
use breakwater_queue_log::disk::{FileSystem, GroupDisk};
use breakwater_queue_log::{LogConfig, LogQueue};
use bytes::Bytes;

const CYCLES: u64 = 30;
const PRODUCERS: usize = 6;
const SECTOR: u64 = 512;
const LEASE: Duration = Duration::from_secs(600);

/// splitmix64: small, seedable, enough to pick cut points.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A write that reached the page cache but not the disk: where, and the
/// bytes it replaced.
struct Unsynced {
    at: u64,
    old: Vec<u8>,
}

struct State {
    rng: Rng,
    calls: u64,
    cut_at: u64,
    cut: bool,
    /// The store's directory, and where its copy after the cut goes.
    from: PathBuf,
    to: PathBuf,
    unsynced: HashMap<u64, Vec<Unsynced>>,
    /// Unsynced sectors the cut undid, and kept.
    undone: u64,
    kept: u64,
}

/// The file layer that loses power at its `cut_at`-th call.
#[derive(Debug)]
struct PowerCut(Mutex<State>);

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PowerCut at call {} of {}", self.cut_at, self.calls)
    }
}

fn power_cut() -> io::Error {
    io::Error::other("the power is off")
}

impl PowerCut {
    fn new(seed: u64, cut_at: u64, from: &Path, to: &Path) -> Arc<Self> {
        Arc::new(Self(Mutex::new(State {
            rng: Rng(seed),
            calls: 0,
            cut_at,
            cut: false,
            from: from.to_owned(),
            to: to.to_owned(),
            unsynced: HashMap::new(),
            undone: 0,
            kept: 0,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("power-cut state")
    }

    fn is_cut(&self) -> bool {
        self.state().cut
    }

    fn report(&self) -> String {
        let s = self.state();
        format!(
            "cut at call {}: {} unsynced sectors lost, {} reached the disk",
            s.cut_at, s.undone, s.kept
        )
    }
}

impl State {
    /// The power goes: the disk as it is now, less a random half of the
    /// sectors written since their file's last sync, is copied to `to`.
    fn cut(&mut self) {
        self.cut = true;
        std::fs::create_dir_all(&self.to).expect("copy dir");
        for entry in std::fs::read_dir(&self.from).expect("read store") {
            let entry = entry.expect("entry");
            let name = entry.file_name();
            if name == "lock" {
                continue;
            }
            match std::fs::copy(entry.path(), self.to.join(&name)) {
                Ok(_) => {}
                // Deleted meanwhile (a reclaim races the copy): gone.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => panic!("copy {}: {e}", name.to_string_lossy()),
            }
        }
        for (segment, writes) in &self.unsynced {
            let path = self.to.join(format!("segment-{segment:016}.log"));
            let Ok(file) = OpenOptions::new().write(true).open(&path) else {
                continue;
            };
            for write in writes.iter().rev() {
                let end = write.at + write.old.len() as u64;
                let mut at = write.at;
                while at < end {
                    let to = ((at / SECTOR + 1) * SECTOR).min(end);
                    if self.rng.next() & 1 == 1 {
                        let from = (at - write.at) as usize;
                        let upto = (to - write.at) as usize;
                        file.write_all_at(&write.old[from..upto], at)
                            .expect("undo a sector");
                        self.undone += 1;
                    } else {
                        self.kept += 1;
                    }
                    at = to;
                }
            }
        }
    }
}

impl GroupDisk for PowerCut {
    fn write_at(&self, segment: u64, file: &File, buf: &[u8], at: u64) -> io::Result<()> {
        let mut state = self.state();
        if state.cut {
            return Err(power_cut());
        }
        state.calls += 1;
        let mut old = vec![0u8; buf.len()];
        let mut read = 0;
        while read < old.len() {
            match file.read_at(&mut old[read..], at + read as u64)? {
                0 => break, // past the end: zeros
                n => read += n,
            }
        }
        let cut_here = state.calls == state.cut_at;
        // Cut mid-write: only a prefix of the group reaches the file.
        let len = if cut_here {
            state.rng.below(buf.len() as u64 + 1) as usize
        } else {
            buf.len()
        };
        file.write_all_at(&buf[..len], at)?;
        state
            .unsynced
            .entry(segment)
            .or_default()
            .push(Unsynced { at, old });
        if cut_here {
            state.cut();
            return Err(power_cut());
        }
        Ok(())
    }

    fn sync_data(&self, segment: u64, file: &File) -> io::Result<()> {
        let mut state = self.state();
        if state.cut {
            return Err(power_cut());
        }
        state.calls += 1;
        if state.calls == state.cut_at {
            state.cut();
            return Err(power_cut());
        }
        file.sync_data()?;
        state.unsynced.remove(&segment);
        Ok(())
    }
}

fn config(dir: &Path) -> LogConfig {
    LogConfig {
        segment_bytes: 64 << 10,
        // Each check claims everything queued at once to read it back;
        // key order would hold back all but each key's first.
        key_order: breakwater_queue::KeyOrder::None,
        ..LogConfig::at(dir)
    }
}

/// A body that names its event, of a length the event decides.
fn body(event: &str) -> Bytes {
    let n = 40 + (fnv1a(event) % 1500) as usize;
    Bytes::from(format!("{event};").repeat(n / (event.len() + 1) + 1))
}

/// FNV-1a: a stable number per event id, to size its body and pick its key.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn message(event: &str) -> NewMessage {
    NewMessage {
        source: "stripe".into(),
        event_id: event.into(),
        entity_key: Some(format!("order-{}", fnv1a(event) % 50)),
        headers: vec![("content-type".into(), "application/json".into())],
        body: body(event),
        received_at_ms: 1_700_000_000_000,
    }
}

/// Opens `config`, waiting out an earlier writer thread on the same
/// directory.
async fn open_on(config: &LogConfig, disk: Arc<dyn GroupDisk>) -> LogQueue {
    for _ in 0..500 {
        match LogQueue::open_on(config, Arc::clone(&disk)) {
            Ok(q) => return q,
            Err(QueueError::Storage(e)) if e.contains("another process") => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("open {}: {e}", config.path.display()),
        }
    }
    panic!("the store's lock was never released");
}

/// What the producers and the consumer of one cycle were told.
#[derive(Default)]
struct Told {
    /// Every event id sent.
    sent: BTreeSet<String>,
    /// Enqueues answered `New`.
    new: BTreeSet<String>,
    /// Of those, the ones the consumer asked to ack (a cut ack may or may
    /// not have reached the disk).
    acked: BTreeSet<String>,
}

/// Runs load on `q` until the power goes.
async fn load_until_cut(q: &LogQueue, cycle: u64, cut: &Arc<PowerCut>) -> Told {
    let told = Arc::new(Mutex::new(Told::default()));
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let (q, told) = (q.clone(), Arc::clone(&told));
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let event = format!("c{cycle}-p{p}-{i}");
                told.lock().expect("told").sent.insert(event.clone());
                match q.enqueue(message(&event)).await {
                    Ok(Enqueued::New { .. }) => {
                        told.lock().expect("told").new.insert(event);
                    }
                    Ok(other) => panic!("{event} was never sent before: {other:?}"),
                    Err(_) => return,
                }
            }
        }));
    }
    let (consumer, told_c, power) = (q.clone(), Arc::clone(&told), Arc::clone(cut));
    tasks.push(tokio::spawn(async move {
        let mut n = 0u64;
        // Claims are in memory: they go on working after the cut.
        while !power.is_cut() {
            let Ok(claimed) = consumer.claim(16, LEASE).await else {
                return;
            };
            if claimed.is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            for d in claimed {
                n += 1;
                let outcome = if n.is_multiple_of(4) {
                    consumer.release(&d.receipt, Duration::ZERO).await
                } else {
                    // Asked, not answered: an ack cut with the power may
                    // still have reached the disk.
                    told_c
                        .lock()
                        .expect("told")
                        .acked
                        .insert(d.message.event_id.clone());
                    consumer.ack(&d.receipt).await
                };
                if outcome.is_err() {
                    return;
                }
            }
        }
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !cut.is_cut() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "cycle {cycle}: the power never went"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for t in tasks {
        t.await.expect("load task");
    }
    std::mem::take(&mut *told.lock().expect("told"))
}

/// Everything the cycles so far were told.
#[derive(Default)]
struct History {
    sent: BTreeSet<String>,
    /// Every event id answered `New`, and whether it was asked to be acked.
    answered: BTreeMap<String, bool>,
}

/// Checks the store found after the cut against what the cycles were
/// told (this cycle's event ids all, and `sample` of the earlier ones for
/// dedup), then settles what is queued so the next cycle starts empty.
/// Returns whether opening it found a torn tail.
async fn check_after_cut(
    dir: &Path,
    history: &mut History,
    cycle: u64,
    rng: &mut Rng,
    report: &str,
) -> bool {
    let q = open_on(&config(dir), Arc::new(FileSystem)).await;
    let torn = q.open_report().torn_bytes > 0;
    let claimed = q.claim(100_000, LEASE).await.expect("claim");
    let mut queued = BTreeSet::new();
    for d in &claimed {
        let event = &d.message.event_id;
        assert!(
            history.sent.contains(event),
            "{report}: {event} was never sent"
        );
        assert_eq!(
            d.message.body,
            body(event),
            "{report}: {event} came back with another body"
        );
        assert!(queued.insert(event.clone()), "{report}: {event} twice");
    }
    for (event, &acked) in &history.answered {
        assert!(
            acked || queued.contains(event),
            "{report}: {event} was answered New, never acked, and is gone"
        );
    }
    let this_cycle = format!("c{cycle}-");
    let earlier: Vec<&String> = history
        .answered
        .keys()
        .filter(|e| !e.starts_with(&this_cycle))
        .collect();
    let mut check: Vec<&String> = history
        .answered
        .keys()
        .filter(|e| e.starts_with(&this_cycle))
        .collect();
    for _ in 0..earlier.len().min(200) {
        check.push(earlier[rng.below(earlier.len() as u64) as usize]);
    }
    for event in check {
        let again = q.enqueue(message(event)).await.expect("enqueue again");
        assert!(
            matches!(again, Enqueued::Duplicate { .. }),
            "{report}: {event} was answered New and is not a duplicate after the cut: {again:?}"
        );
    }
    for d in &claimed {
        q.ack(&d.receipt).await.expect("settle");
        history.answered.insert(d.message.event_id.clone(), true);
    }
    torn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_when_the_power_goes_mid_group() {
    let seed = std::env::var("POWER_LOSS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("POWER_LOSS_SEED={seed}");
    let mut rng = Rng(seed);
    let root = tempfile::tempdir().expect("tempdir");
    let mut history = History::default();
    let (mut sectors_lost, mut torn_opens) = (0u64, 0u64);
    for cycle in 0..CYCLES {
        let (from, to) = (
            root.path().join(format!("disk-{cycle}")),
            root.path().join(format!("disk-{}", cycle + 1)),
        );
        let cut_at = 1 + rng.below(600);
        let cut = PowerCut::new(rng.next(), cut_at, &from, &to);
        let q = open_on(&config(&from), cut.clone()).await;
        let told = load_until_cut(&q, cycle, &cut).await;
        drop(q);
        history.sent.extend(told.sent);
        for event in told.new {
            let acked = told.acked.contains(&event);
            history.answered.insert(event, acked);
        }
        let report = format!("seed {seed}, cycle {cycle}, {}", cut.report());
        sectors_lost += cut.state().undone;
        torn_opens += u64::from(check_after_cut(&to, &mut history, cycle, &mut rng, &report).await);
    }
    eprintln!(
        "{CYCLES} power cuts: {} event ids answered New, {sectors_lost} unsynced sectors lost, {torn_opens} opens found a torn tail",
        history.answered.len()
    );
    assert!(
        history.answered.len() as u64 > CYCLES * 10,
        "too little got through: {}",
        history.answered.len()
    );
    assert!(sectors_lost > 0, "no cut ever lost an unsynced write");
}
