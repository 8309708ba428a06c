//! A Kafka broker of a test's own (tansu, the binary `BREAKWATER_TANSU`
//! names; `scripts/test.sh` installs it) behind a fault proxy, advertising
//! the proxy so that every connection of the clients goes through it: a
//! test cuts or stalls them to play a broker outage. With the `tansu`
//! feature, for tests.

use std::time::{Duration, Instant};

use breakwater_faultproxy::FaultProxy;

/// A tansu broker of the test's own behind a fault proxy, advertising the
/// proxy, so every connection of the clients goes through it.
pub struct ProxiedBroker {
    child: std::process::Child,
    /// The proxy every connection goes through.
    pub proxy: FaultProxy,
}

impl ProxiedBroker {
    /// Starts tansu on a free port (memory storage) and the proxy before
    /// it; panics when it cannot (a test needs it).
    pub async fn start() -> Self {
        let tansu = std::env::var("BREAKWATER_TANSU").unwrap_or_else(|_| {
            panic!("BREAKWATER_TANSU names the tansu binary (scripts/test.sh sets it)")
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let broker: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let proxy = FaultProxy::start("127.0.0.1:0".parse().expect("addr"), broker)
            .await
            .expect("proxy");
        let child = std::process::Command::new(tansu)
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://{broker}"),
                "--advertised-listener-url",
                &format!("tcp://{}", proxy.local_addr()),
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start tansu");
        let up = Instant::now();
        while std::net::TcpStream::connect(broker).is_err() {
            assert!(
                up.elapsed() < Duration::from_secs(10),
                "tansu did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, proxy }
    }

    /// The bootstrap servers: the proxy.
    pub fn url(&self) -> String {
        self.proxy.local_addr().to_string()
    }
}

impl Drop for ProxiedBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
