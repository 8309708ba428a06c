//! Files on disk, from outside: what the real binary creates holds whole
//! payloads (the queue's segments, `dedup.log`, `dlq.db`, the SQLite
//! sink), so none of it may be readable by anyone but its owner, whatever
//! the umask; and a `secrets_file` others may read is warned about.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::utils::*;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

/// Every file and folder under `dir`, `dir` included.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_owned()];
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(tree(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Replaces `from` by `to` in the sandbox's config.
fn edit_config(sandbox: &Sandbox, from: &str, to: &str) {
    let path = sandbox.config_path();
    let text = std::fs::read_to_string(&path).expect("config");
    assert!(text.contains(from), "{from} not in the config");
    std::fs::write(&path, text.replace(from, to)).expect("write config");
}

/// Under umask 022 the queue (its folder, segments, blanks, `lock`,
/// `dedup.log`, `dlq.db` and its `-wal`/`-shm`) and the SQLite sink's
/// database (and its `-wal`/`-shm`) are created for their owner only, the
/// folders Breakwater makes on the way too; a folder the user made is
/// left as it was.
#[tokio::test]
async fn the_queue_and_the_sqlite_sink_are_readable_by_their_owner_only() {
    let sandbox = Sandbox::new("");
    let root = sandbox.dir.path();
    // A folder of the user's own, readable by all, with the data below.
    let mine = root.join("mine");
    std::fs::create_dir(&mine).expect("mkdir");
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let queue = mine.join("made").join("queue");
    let sink_dir = mine.join("sinkdir").join("deeper");
    edit_config(
        &sandbox,
        &format!("path = \"{}\"", sandbox.queue_dir().display()),
        &format!("path = \"{}\"", queue.display()),
    );
    edit_config(
        &sandbox,
        &format!("sqlite://{}", root.join("sink.db").display()),
        &format!("sqlite://{}", sink_dir.join("sink.db").display()),
    );

    let server = Server::start_with_umask(&sandbox.config_path(), "all", "022");
    let http = Http::default();
    let a = post_stripe(&http, &server, stripe_event("evt_private", "7")).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    // Applied: the sink has written its WAL.
    let deadline = Instant::now() + Duration::from_secs(20);
    while queue_stats(&http, &server).await["acked_total"].as_u64() != Some(1) {
        assert!(Instant::now() < deadline, "not applied in 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut files = tree(&mine.join("made"));
    files.extend(tree(&mine.join("sinkdir")));
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    for expected in [
        "queue",
        "lock",
        "dedup.log",
        "dlq.db",
        "dlq.db-wal",
        "dlq.db-shm",
        "sink.db",
        "sink.db-wal",
        "sink.db-shm",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not made: {names:?}"
        );
    }
    assert!(
        names.iter().any(|n| n.starts_with("segment-")),
        "no segment: {names:?}"
    );
    let open: Vec<String> = files
        .iter()
        .filter(|p| mode(p) & 0o077 != 0)
        .map(|p| format!("{} {:o}", p.display(), mode(p)))
        .collect();
    assert!(
        open.is_empty(),
        "readable beyond their owner under umask 022: {open:#?}"
    );
    assert_eq!(mode(&mine), 0o755, "a folder the user made is left alone");
}

/// A `secrets_file` its group or others may read: a WARN line when
/// `serve` starts and when `config check` runs; none once it is 0600.
#[tokio::test]
async fn a_secrets_file_others_may_read_is_warned_about() {
    let sandbox = Sandbox::new("");
    let secrets = sandbox.dir.path().join("github.secrets");
    std::fs::write(&secrets, format!("{GITHUB_SECRET}\n")).expect("write");
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let text = std::fs::read_to_string(sandbox.config_path()).expect("config");
    std::fs::write(
        sandbox.config_path(),
        format!(
            "{text}\n[[source]]\nname = \"filed\"\nscheme = \"github\"\nsecrets_file = \"{}\"\n",
            secrets.display()
        ),
    )
    .expect("write config");
    let warned = |lines: &[String]| {
        lines
            .iter()
            .any(|l| l.contains("WARN") && l.contains("secrets_file") && l.contains("filed"))
    };
    let config_check = || {
        let out = Command::new(binary())
            .args(["config", "check", "--config"])
            .arg(sandbox.config_path())
            .env("NO_COLOR", "1")
            .output()
            .expect("config check");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };

    let server = sandbox.start_ingress();
    assert!(warned(&server.startup), "{:#?}", server.startup);
    drop(server);
    assert!(warned(&config_check()), "{:#?}", config_check());

    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let server = sandbox.start_ingress();
    assert!(!warned(&server.startup), "{:#?}", server.startup);
    assert!(!warned(&config_check()));
}
