//! Brokers of a test's own, for faults a test may not inflict on the
//! machine's shared ones: a RabbitMQ node (its own name, ports and store),
//! a Kafka broker (tansu) and an SQS endpoint (moto). The fault matrix
//! kills the first and starts it again on its store, and freezes the
//! Kafka broker (its data lives in memory); moto, which does not answer
//! again after a freeze under load, is cut off at a fault proxy instead.
//! Each stops on drop.
//!
//! `scripts/fault-matrix.sh` installs what they run: `rabbitmq-server`,
//! moto's server (`BREAKWATER_MOTO_SERVER`) and tansu (`BREAKWATER_TANSU`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::own_pg::free_port;

fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Waits until `port` listens (`true`) or stops listening (`false`).
fn wait_for(port: u16, up: bool, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while listening(port) != up {
        assert!(
            Instant::now() < deadline,
            "{what} did not {} within {within:?}",
            if up { "listen" } else { "stop" }
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `command` (output dropped) and waits until it listens on `port`.
fn spawn_listening(command: &mut Command, port: u16, within: Duration, what: &str) -> Child {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    wait_for(port, true, within, what);
    child
}

fn signal(pid: u32, sig: &str) {
    let sent = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(sent.success(), "kill {sig} {pid}");
}

/// The program an environment variable names (set by the script that
/// installs it).
fn program(var: &str) -> String {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} names the program (scripts/fault-matrix.sh sets it)"))
}

/// A RabbitMQ node of the test's own: its own node name, AMQP and
/// distribution ports, store and log under a scratch directory (owned by
/// the `rabbitmq` user, which Debian's `rabbitmq-server` runs as), no
/// plugins. Needs root.
pub(crate) struct OwnRabbit {
    dir: tempfile::TempDir,
    node: String,
    port: u16,
    dist_port: u16,
    /// The Erlang VM's process, which a kill must reach (the wrapper
    /// script that started it is not it).
    beam: Option<u32>,
    /// The wrapper, reaped once the VM is gone.
    wrapper: Option<Child>,
}

impl OwnRabbit {
    pub(crate) fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("bw-own-rabbit-")
            .tempdir()
            .expect("tempdir");
        let port = free_port();
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n").expect("plugins file");
        std::fs::write(
            dir.path().join("rabbitmq.conf"),
            format!("listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n"),
        )
        .expect("config file");
        let owned = Command::new("chown")
            .args(["-R", "rabbitmq:"])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(
            owned.success(),
            "the node's directory must be the rabbitmq user's (root needed)"
        );
        let mut me = Self {
            node: format!("bwfm{}@localhost", std::process::id()),
            port,
            dist_port: free_port(),
            dir,
            beam: None,
            wrapper: None,
        };
        me.spawn();
        me
    }

    fn spawn(&mut self) {
        let d = self.dir.path();
        let env = |name: &str| d.join(name);
        let wrapper = Command::new("rabbitmq-server")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", env("mnesia"))
            .env("RABBITMQ_LOG_BASE", env("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", env("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", env("rabbitmq.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("rabbitmq-server is needed (Debian's rabbitmq-server): {e}")
            });
        self.wrapper = Some(wrapper);
        wait_for(self.port, true, Duration::from_secs(90), "RabbitMQ");
        self.beam = Some(self.beam_pid());
    }

    fn beam_pid(&self) -> u32 {
        let out = Command::new("rabbitmqctl")
            .args(["-n", &self.node, "eval", "os:getpid()."])
            .output()
            .expect("rabbitmqctl");
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .trim_matches('"')
            .parse()
            .unwrap_or_else(|_| panic!("the node's pid from rabbitmqctl: {text:?}"))
    }

    pub(crate) fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// SIGKILL to the node's VM: no clean shutdown.
    pub(crate) fn kill(&mut self) {
        if let Some(pid) = self.beam.take() {
            signal(pid, "-KILL");
            wait_for(self.port, false, Duration::from_secs(10), "RabbitMQ");
        }
        if let Some(mut wrapper) = self.wrapper.take() {
            let _ = wrapper.kill();
            let _ = wrapper.wait();
        }
    }

    /// Starts the node again on its store.
    pub(crate) fn restart(&mut self) {
        self.spawn();
    }
}

impl Drop for OwnRabbit {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A moto server of the test's own (SQS and S3, in memory).
pub(crate) struct OwnMoto {
    child: Child,
    port: u16,
}

impl OwnMoto {
    pub(crate) fn start() -> Self {
        let port = free_port();
        let child = spawn_listening(
            Command::new(program("BREAKWATER_MOTO_SERVER")).args([
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ]),
            port,
            Duration::from_secs(30),
            "moto_server",
        );
        Self { child, port }
    }

    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Whether it answers a plain request within `within`.
    pub(crate) fn answers(&self, within: Duration) -> bool {
        use std::io::{Read, Write};
        let Ok(mut conn) = std::net::TcpStream::connect(self.addr()) else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(within));
        let asked = conn.write_all(b"GET /?Action=ListQueues HTTP/1.0\r\nHost: moto\r\n\r\n");
        let mut head = [0_u8; 12];
        asked.is_ok() && conn.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
    }
}

impl Drop for OwnMoto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tansu Kafka broker of the test's own (its log in memory: tansu as
/// shipped here has no durable storage engine but S3, and on a moto S3 it
/// was too slow to consume from at all in one run of two, so the fault it
/// takes is a freeze, not a restart).
pub(crate) struct OwnTansu {
    child: Child,
    port: u16,
}

impl OwnTansu {
    pub(crate) fn start() -> Self {
        let port = free_port();
        let listener = format!("tcp://127.0.0.1:{port}");
        let child = spawn_listening(
            Command::new(program("BREAKWATER_TANSU"))
                .args(["broker", "--listener-url", &listener])
                .args(["--advertised-listener-url", &listener])
                .args(["--storage-engine", "memory://tansu/"]),
            port,
            Duration::from_secs(10),
            "tansu",
        );
        Self { child, port }
    }

    pub(crate) fn url(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGSTOP: connections stay open and nothing answers.
    pub(crate) fn freeze(&self) {
        signal(self.child.id(), "-STOP");
    }

    pub(crate) fn thaw(&self) {
        signal(self.child.id(), "-CONT");
    }
}

impl Drop for OwnTansu {
    fn drop(&mut self) {
        self.thaw();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
