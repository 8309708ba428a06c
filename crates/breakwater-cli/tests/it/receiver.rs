//! A real HTTP service for the forward tests: it listens on a loopback port
//! of its own, records every request (when, headers, body) and answers as
//! the test's [`Script`] says: a status with headers, or never.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// How the receiver answers one request.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(StatusCode, Vec<(&'static str, String)>),
    /// Accept the request and never answer.
    Hang,
}

/// What to answer to the `n`th request (from 0), `elapsed` after start.
pub type Script = Arc<dyn Fn(usize, Duration) -> Reply + Send + Sync>;

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    /// The request's path and query.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The running receiver.
pub struct Receiver {
    pub addr: SocketAddr,
    /// When it started listening (the script's `elapsed` counts from it).
    pub started: Instant,
    received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start(script: Script) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let log = Arc::clone(&received);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (log, script) = (Arc::clone(&log), Arc::clone(&script));
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (log, script) = (Arc::clone(&log), Arc::clone(&script));
                        async move {
                            let at = Instant::now();
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let n = {
                                let mut log = log.lock().expect("log");
                                log.push(Received {
                                    at,
                                    path: parts
                                        .uri
                                        .path_and_query()
                                        .map_or_else(String::new, ToString::to_string),
                                    headers: parts.headers,
                                    body,
                                });
                                log.len() - 1
                            };
                            match script(n, started.elapsed()) {
                                Reply::Status(status, headers) => {
                                    let mut response = Response::builder().status(status);
                                    for (k, v) in headers {
                                        response = response.header(k, v);
                                    }
                                    response.body(Full::new(Bytes::from_static(b"receiver says")))
                                }
                                Reply::Hang => {
                                    std::future::pending::<()>().await;
                                    unreachable!()
                                }
                            }
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            started,
            received,
            task,
        }
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("log").clone()
    }

    /// Waits until `n` requests arrived.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver got {} of {n} requests in {within:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers every request with `status`.
pub fn always(status: StatusCode) -> Script {
    Arc::new(move |_, _| Reply::Status(status, Vec::new()))
}
