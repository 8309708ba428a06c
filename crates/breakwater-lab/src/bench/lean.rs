//! The lean floor under `bench ingress --floor`: the least a verified,
//! durable ingress can do on this machine, with nothing of Breakwater in
//! it.
//!
//! Issue 23 measured this from outside the project: a bare hyper server
//! that checks the Stripe signature, appends the body and answers after
//! one `fdatasync` per group, nothing else. [`start`] is that server, so
//! the same run can put Breakwater beside it: no router, no event-id or
//! entity-key extraction, no headers kept, no dedup, no metrics, no JSON
//! in the reply. The signature check is [`breakwater_verify`]'s own (the
//! one thing both must do the same way), and the writer is a thread of its
//! own that takes whatever has queued (no linger), writes it with one
//! positioned write into a preallocated ring (as [`super::floor`] does)
//! and `fdatasync`s it before any of the group is answered.
//!
//! What lies between [`super::floor`]'s own-thread floor and this one is
//! the cost of Breakwater's request path outside its queue.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, body::Incoming};
use tokio::sync::{mpsc, oneshot};

use breakwater_queue_embedded::writer::drain;
use breakwater_verify::{Scheme, Verifier};

use super::floor::{RING_BYTES, preallocate, ring_offset};

/// Bodies the writer takes at once, at most (the embedded queue's default
/// `max_batch`).
const MAX_GROUP: usize = 256;

/// A body on its way to the writer, and where to say it is on disk.
struct Append {
    body: Bytes,
    done: oneshot::Sender<Result<(), String>>,
}

/// Where the lean floor's writer puts each group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeanFile {
    /// A preallocated ring, zero-filled once and rewritten: no file size
    /// or new blocks for any `fdatasync` to record (what `bench ingress`
    /// runs).
    Ring,
    /// Appended to a file that grows, as a queue that keeps every webhook
    /// must grow without zero-filling ahead: each `fdatasync` also records
    /// the new size and blocks (`examples/floor_server.rs append`).
    Append,
}

/// Starts the lean floor on an ephemeral loopback port, its ring file at
/// `path`, checking Stripe signatures made with `secret`. Its writer
/// thread (named `queue-lean`, so the bench counts its CPU with the
/// queue's) ends when the server's tasks are gone.
pub async fn start(path: &Path, secret: &str) -> anyhow::Result<SocketAddr> {
    start_on(path, secret, LeanFile::Ring).await
}

/// [`start`], writing as `how` says.
pub async fn start_on(path: &Path, secret: &str, how: LeanFile) -> anyhow::Result<SocketAddr> {
    let file = match how {
        LeanFile::Ring => preallocate(path, RING_BYTES)?,
        LeanFile::Append => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?,
    };
    let verifier = Verifier::new(Scheme::stripe(), &[secret.to_owned()])?;
    let (appends, rx) = mpsc::channel::<Append>(MAX_GROUP * 4);
    std::thread::Builder::new()
        .name("queue-lean".into())
        .spawn(move || append_loop(&file, rx, how))?;
    super::serve_plain_hyper(service_fn(move |req| {
        let (verifier, appends) = (verifier.clone(), appends.clone());
        async move { Ok::<_, Infallible>(take(req, &verifier, &appends).await) }
    }))
    .await
}

/// One webhook: read, verify, append, answer once it is on disk.
async fn take(
    req: Request<Incoming>,
    verifier: &Verifier,
    appends: &mpsc::Sender<Append>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return answer(StatusCode::BAD_REQUEST);
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if verifier.verify(&parts.headers, &body, now).is_err() {
        return answer(StatusCode::UNAUTHORIZED);
    }
    let (done, on_disk) = oneshot::channel();
    if appends.send(Append { body, done }).await.is_err() {
        return answer(StatusCode::SERVICE_UNAVAILABLE);
    }
    match on_disk.await {
        Ok(Ok(())) => answer(StatusCode::ACCEPTED),
        _ => answer(StatusCode::SERVICE_UNAVAILABLE),
    }
}

fn answer(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// Writes each group (each body behind its length) into the ring,
/// `fdatasync`s, then answers it.
fn append_loop(file: &std::fs::File, mut rx: mpsc::Receiver<Append>, how: LeanFile) {
    let mut group: Vec<Append> = Vec::with_capacity(MAX_GROUP);
    let mut bytes: Vec<u8> = Vec::new();
    let mut end: u64 = 0;
    while let Some(first) = rx.blocking_recv() {
        group.push(first);
        drain(&mut rx, &mut group, MAX_GROUP);
        bytes.clear();
        for a in &group {
            bytes.extend_from_slice(&(a.body.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&a.body);
        }
        let at = match how {
            LeanFile::Ring => ring_offset(end, bytes.len() as u64),
            LeanFile::Append => end,
        };
        end = at + bytes.len() as u64;
        let written = file
            .write_all_at(&bytes, at)
            .and_then(|()| file.sync_data())
            .map_err(|e| e.to_string());
        for a in group.drain(..) {
            let _ = a.done.send(written.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use breakwater_verify::sign;

    /// Posts `body` to the floor at `addr`, Stripe-signed now with
    /// `secret`: the status it answered.
    async fn post_signed(addr: SocketAddr, secret: &str, body: &'static [u8]) -> StatusCode {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Full<Bytes>>();
        let mut req = Request::post(format!("http://{addr}/"));
        for (name, value) in sign(&Scheme::stripe(), secret, body, now, "evt").expect("signed") {
            req = req.header(name, value);
        }
        let req = req
            .body(Full::new(Bytes::from_static(body)))
            .expect("request");
        client.request(req).await.expect("answered").status()
    }

    /// A signed body is accepted and lands in the ring; a bad signature is
    /// refused and does not.
    #[tokio::test]
    async fn a_signed_body_is_written_and_a_forged_one_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ring = dir.path().join("lean.log");
        let addr = start(&ring, "whsec_test").await.expect("started");
        let body = br#"{"id":"evt_lean_1"}"#;
        assert_eq!(
            post_signed(addr, "whsec_other", body).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            post_signed(addr, "whsec_test", body).await,
            StatusCode::ACCEPTED
        );

        let mut head = vec![0u8; 4 + body.len()];
        std::fs::File::open(&ring)
            .expect("ring")
            .read_exact_at(&mut head, 0)
            .expect("read");
        assert_eq!(&head[..4], &(body.len() as u32).to_le_bytes());
        assert_eq!(&head[4..], body, "the signed body is the first record");
    }

    /// Appending, the file grows by each record and nothing else: no
    /// ring, no preallocated zeros.
    #[tokio::test]
    async fn appending_grows_the_file_by_each_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("append.log");
        let addr = start_on(&path, "whsec_test", LeanFile::Append)
            .await
            .expect("started");
        let bodies: [&'static [u8]; 2] = [br#"{"id":"evt_a"}"#, br#"{"id":"evt_bb"}"#];
        let mut expected = Vec::new();
        for body in bodies {
            assert_eq!(
                post_signed(addr, "whsec_test", body).await,
                StatusCode::ACCEPTED
            );
            expected.extend_from_slice(&(body.len() as u32).to_le_bytes());
            expected.extend_from_slice(body);
        }
        assert_eq!(std::fs::read(&path).expect("read"), expected);
    }
}
