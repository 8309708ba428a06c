//! A PostgreSQL server of the test's own (initdb in a scratch directory,
//! its own port), for faults a test may not inflict on the machine's shared
//! server: a restart, a stop.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A private PostgreSQL cluster, stopped and deleted on drop.
pub struct OwnPostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
}

/// The newest `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("PostgreSQL's binaries are required under {root:?}: {e}"))
        .filter_map(Result::ok)
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("no PostgreSQL version under {root:?}"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"))
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl OwnPostgres {
    /// initdb (trust auth) and start it.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("bw-own-pg-")
            .tempdir()
            .expect("tempdir");
        let me = Self {
            dir,
            bin: bin_dir(),
            port: free_port(),
        };
        if is_root() {
            // PostgreSQL refuses to run as root: its files are postgres's.
            let out = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(me.dir.path())
                .output()
                .expect("chown");
            assert!(out.status.success(), "chown: {out:?}");
        }
        let data = me.data();
        me.run(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
        );
        me.pg_ctl(&["start"]);
        me
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let path = self.bin.join(tool);
        let out = if is_root() {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&path)
                .args(args)
                .output()
        } else {
            Command::new(&path).args(args).output()
        }
        .unwrap_or_else(|e| panic!("{path:?}: {e}"));
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `pg_ctl <action>` on this cluster, waiting for it to complete.
    pub fn pg_ctl(&self, action: &[&str]) {
        let data = self.data();
        let log = self.dir.path().join("log").display().to_string();
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        let mut args = vec!["-D", &data, "-l", &log, "-o", &opts, "-w", "-t", "60"];
        args.extend_from_slice(action);
        self.run("pg_ctl", &args);
    }

    pub fn restart_fast(&self) {
        self.pg_ctl(&["restart", "-m", "fast"]);
    }

    pub fn stop(&self) {
        self.pg_ctl(&["stop", "-m", "fast"]);
    }

    pub fn resume(&self) {
        self.pg_ctl(&["start"]);
    }

    /// The URL of `database` on it.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let data = self.data();
        let path = self.bin.join("pg_ctl");
        let _ = if is_root() {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&path)
                .args(["-D", &data, "stop", "-m", "immediate"])
                .output()
        } else {
            Command::new(&path)
                .args(["-D", &data, "stop", "-m", "immediate"])
                .output()
        };
    }
}
