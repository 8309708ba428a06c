//! Test helpers: start the real `breakwater` binary on ephemeral ports,
//! send it real HTTP, sign like real senders.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use breakwater_verify::Scheme;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Path of the binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_breakwater")
}

/// Secrets used by the test config.
pub const STRIPE_SECRET: &str = "whsec_test_stripe_secret";
pub const GITHUB_SECRET: &str = "It's a Secret to Everybody";
pub const SHOPIFY_SECRET: &str = "shpss_test_secret";
pub const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const HMAC_SECRET: &str = "generic-secret";

/// The sources every test server has; `stripe` comes last so that
/// `[[source.statement]]` tables in a sandbox's `extra` attach to it.
pub fn sources_toml() -> String {
    format!(
        r#"

[[source]]
name = "github"
scheme = "github"
secrets = ["{GITHUB_SECRET}"]
entity_key = "json:/repository/id"

[[source]]
name = "shopify"
scheme = "shopify"
secrets = ["{SHOPIFY_SECRET}"]
entity_key = "json:/id"

[[source]]
name = "standard"
scheme = "standard"
secrets = ["{STANDARD_SECRET}"]

[[source]]
name = "generic"
scheme = "hmac"
secrets = ["{HMAC_SECRET}"]
header = "X-Signature"
algorithm = "sha1"
encoding = "base64"
prefix = "sha1="
event_id = "header:X-Event-Id"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["whsec_old_rotated_out", "{STRIPE_SECRET}"]
entity_key = "json:/data/object/id"
"#
    )
}

/// A scratch directory with a config file.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
}

impl Sandbox {
    /// A sandbox whose config is the standard sources followed by `extra`,
    /// with listeners on port 0 and data under the sandbox. The default
    /// sink is SQLite under the sandbox.
    pub fn new(extra: &str) -> Self {
        Self::build("", None, extra)
    }

    /// A sandbox whose `[queue]` table is `queue` (a broker's) instead of
    /// the default store (the segment log) under the sandbox; `{queue_dir}` in it stands
    /// for the sandbox's queue directory.
    pub fn with_queue(queue: &str, extra: &str) -> Self {
        Self::build("", Some(queue), extra)
    }

    /// A sandbox whose queue is the embedded SQLite store under the
    /// sandbox (the default is the segment log), for tests that read its
    /// `queue.db`.
    pub fn with_embedded_queue(extra: &str) -> Self {
        Self::with_queue(
            "[queue]\nbackend = \"embedded\"\npath = \"{queue_dir}\"\n",
            extra,
        )
    }

    /// A sandbox whose queue is the segment log under the sandbox, named
    /// in the config (as the default would choose it).
    pub fn with_log_queue(extra: &str) -> Self {
        Self::with_queue(
            "[queue]\nbackend = \"log\"\npath = \"{queue_dir}\"\n",
            extra,
        )
    }

    /// A sandbox with `ingress` lines added to its `[ingress]` table.
    pub fn with_ingress(ingress: &str, extra: &str) -> Self {
        Self::build(ingress, None, extra)
    }

    fn build(ingress: &str, queue: Option<&str>, extra: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("bw-it-")
            .tempdir_in(std::env::temp_dir())
            .expect("tempdir");
        let data = dir.path().join("queue");
        let queue = queue.map_or_else(
            // Two blanks, not the default's twelve: every test's store
            // zero-fills its blanks while it idles, on a disk all the
            // tests share.
            || {
                format!(
                    "[queue]\npath = \"{}\"\nfree_segments = 2\n",
                    data.display()
                )
            },
            |q| q.replace("{queue_dir}", &data.display().to_string()),
        );
        let config = format!(
            r#"
[ingress]
listen = "127.0.0.1:0"
max_body_bytes = 4096
{ingress}

[admin]
listen = "127.0.0.1:0"

{}
{queue}
{}
{extra}
"#,
            if extra.contains("[sink]") {
                String::new()
            } else {
                format!(
                    "[sink]\nurl = \"sqlite://{}\"\n",
                    dir.path().join("sink.db").display()
                )
            },
            sources_toml()
        );
        std::fs::write(dir.path().join("breakwater.toml"), config).expect("write config");
        Self { dir }
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("breakwater.toml")
    }

    pub fn queue_db(&self) -> PathBuf {
        self.dir.path().join("queue").join("queue.db")
    }

    /// The queue's directory.
    pub fn queue_dir(&self) -> PathBuf {
        self.dir.path().join("queue")
    }

    /// Starts `breakwater serve` (ingress and workers) with this sandbox's
    /// config, and waits for the workers.
    pub fn start(&self) -> Server {
        Server::start(&self.config_path(), "all")
    }

    /// Starts `breakwater serve` (ingress and workers) and waits only for
    /// its listeners, not for the workers (which wait for the sink).
    pub fn start_listening(&self) -> Server {
        Server::spawn(&self.config_path(), "all", false, &[])
    }

    /// Starts only the ingress, so accepted messages stay in the queue.
    pub fn start_ingress(&self) -> Server {
        Server::start(&self.config_path(), "ingress")
    }
}

/// A running `breakwater serve` child process.
pub struct Server {
    pub child: Child,
    pub ingress: SocketAddr,
    pub admin: SocketAddr,
    pub log: mpsc::Receiver<String>,
    /// What it logged until it was up.
    pub startup: Vec<String>,
}

fn addr_in(line: &str) -> Option<SocketAddr> {
    let start = line.find("addr=")? + 5;
    let rest = &line[start..];
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

impl Server {
    /// Starts the binary and waits until both listeners are up and, unless
    /// the role is `ingress`, the workers have started.
    pub fn start(config: &Path, role: &str) -> Self {
        Self::spawn(config, role, role != "ingress", &[])
    }

    /// Like [`Server::start`], with `env` set for the process.
    pub fn start_with_env(config: &Path, role: &str, env: &[(&str, &str)]) -> Self {
        Self::spawn(config, role, role != "ingress", env)
    }

    /// Like [`Server::start`], the binary started under `umask` (through
    /// `sh`, which `exec`s it: the child is the binary).
    pub fn start_with_umask(config: &Path, role: &str, umask: &str) -> Self {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
            .arg(binary());
        Self::spawn_from(sh, config, role, role != "ingress", &[])
    }

    fn spawn(config: &Path, role: &str, wait_for_workers: bool, env: &[(&str, &str)]) -> Self {
        Self::spawn_from(Command::new(binary()), config, role, wait_for_workers, env)
    }

    /// `start`, a command that runs the binary with the arguments it is
    /// given.
    fn spawn_from(
        mut start: Command,
        config: &Path,
        role: &str,
        wait_for_workers: bool,
        env: &[(&str, &str)],
    ) -> Self {
        let mut child = start
            .args(["serve", "--role", role, "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn breakwater");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (mut ingress, mut admin) = (None, None);
        // A worker-only process binds no ingress.
        let wants_ingress = role != "worker";
        let mut workers = !wait_for_workers;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        while (wants_ingress && ingress.is_none()) || admin.is_none() || !workers {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let _ = child.kill();
                panic!(
                    "breakwater did not start in 20 s; it said:\n{}",
                    seen.join("\n")
                );
            };
            let line = strip_ansi(&line);
            seen.push(line.clone());
            if line.contains("ingress listening") {
                ingress = addr_in(&line);
            } else if line.contains("admin listening") {
                admin = addr_in(&line);
            } else if line.contains("workers started") {
                workers = true;
            }
        }
        let admin = admin.expect("admin addr");
        Self {
            child,
            // A worker has no ingress: its `url()` reaches the admin
            // listener, which takes no webhooks.
            ingress: ingress.unwrap_or(admin),
            admin,
            log: rx,
            startup: seen,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.ingress, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A plain HTTP/1.1 client.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

/// An answer: status, headers, body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

impl Default for Http {
    fn default() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

impl Http {
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: impl Into<Bytes>,
    ) -> Result<Answer, hyper_util::client::legacy::Error> {
        let mut req = http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let req = req.body(Full::new(body.into())).expect("request");
        let resp = self.client.request(req).await?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    pub async fn get(&self, url: &str) -> Answer {
        self.send(Method::GET, url, &[], Bytes::new())
            .await
            .expect("GET")
    }

    pub async fn post(
        &self,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Vec<u8>,
    ) -> Answer {
        self.send(Method::POST, url, headers, body)
            .await
            .expect("POST")
    }

    /// A bodiless POST to the admin API as the CLI sends it: with
    /// `Content-Type: application/json` (a write without one is refused).
    pub async fn admin_post(&self, url: &str) -> Answer {
        let json = [(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )];
        self.post(url, &json, Vec::new()).await
    }
}

pub fn unix_now() -> i64 {
    breakwater::ingress::unix_now()
}

/// A Stripe event body for `order`.
pub fn stripe_event(event_id: &str, order: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": event_id,
        "object": "event",
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": order, "status": "paid"}}
    }))
    .expect("json")
}

/// Headers a real Stripe sender would attach, signed at `at`.
pub fn stripe_headers(body: &[u8], at: i64) -> Vec<(HeaderName, HeaderValue)> {
    let mut h =
        breakwater_verify::sign(&Scheme::stripe(), STRIPE_SECRET, body, at, "").expect("sign");
    h.push((
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    ));
    h
}

/// POSTs `body` to the server's Stripe source, signed now.
pub async fn post_stripe(http: &Http, server: &Server, body: Vec<u8>) -> Answer {
    let headers = stripe_headers(&body, unix_now());
    http.post(&server.url("/webhooks/stripe"), &headers, body)
        .await
}

/// Queue counts from the admin API.
pub async fn queue_stats(http: &Http, server: &Server) -> serde_json::Value {
    http.get(&server.admin_url("/queue/stats")).await.json()
}
