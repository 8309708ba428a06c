//! The forward sink against real servers on loopback ports: an HTTPS
//! service (a TLS server started by the test, with a certificate made for
//! it by a CA the test trusts through the target's `ca_file`, or does
//! not), and the listeners its reachability check must tell apart.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_sink::{Applied, Event, ForwardSpec, ForwardTarget};
use breakwater_verify::{Scheme, Verifier};
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request as the service saw it.
struct Seen {
    version: Version,
    headers: HeaderMap,
    body: Bytes,
}

/// An HTTPS service answering 200 to everything, and the PEM of the CA
/// that signed its certificate (for `127.0.0.1` and `localhost`).
struct TlsService {
    addr: SocketAddr,
    ca_pem: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn start_tls_service() -> TlsService {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "breakwater test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("service key");
    let params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("service params");
    let cert = params
        .signed_by(&key, &issuer)
        .expect("service certificate");

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("server certificate");
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, log) = (acceptor.clone(), Arc::clone(&log));
            tokio::spawn(async move {
                // A client that does not trust the certificate ends the
                // handshake: nothing to serve then.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let log = Arc::clone(&log);
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map(|b| b.to_bytes())?;
                        log.lock().expect("log").push(Seen {
                            version: parts.version,
                            headers: parts.headers,
                            body,
                        });
                        Ok::<_, hyper::Error>(
                            Response::builder()
                                .status(StatusCode::OK)
                                .body(Full::new(Bytes::new()))
                                .expect("response"),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    TlsService {
        addr,
        ca_pem: ca.pem(),
        seen,
    }
}

fn spec(url: String, ca_file: Option<std::path::PathBuf>, http2: bool) -> ForwardSpec {
    ForwardSpec {
        url,
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
        max_connections: 4,
        secret: Some(SECRET.to_owned()),
        http2,
        follow_redirects: 0,
        ca_file,
    }
}

fn event<'a>(id: &'a str, body: &'a [u8], headers: &'a [(String, String)]) -> Event<'a> {
    Event {
        source: "stripe",
        event_id: id,
        entity_key: None,
        headers,
        body,
        received_at_ms: 0,
        attempt: 1,
    }
}

#[tokio::test]
async fn an_https_target_is_reached_over_http1_and_http2_with_its_own_ca() {
    let service = start_tls_service().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &service.ca_pem).expect("write the CA");
    let url = format!("https://127.0.0.1:{}/hooks", service.addr.port());
    let headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    let verifier =
        Verifier::new(Scheme::standard(), &[SECRET.to_owned()]).expect("the test's secret");

    for (http2, id, version) in [
        (false, "evt_tls_1", Version::HTTP_11),
        (true, "evt_tls_2", Version::HTTP_2),
    ] {
        let target = ForwardTarget::new(spec(url.clone(), Some(ca_file.clone()), http2))
            .expect("an https target with a CA file");
        let body = format!(r#"{{"id":"{id}"}}"#);
        let applied = target
            .forward(&event(id, body.as_bytes(), &headers), 1, false)
            .await
            .expect("forwarded over TLS");
        assert_eq!(applied, Applied::New);
        let seen = service.seen.lock().expect("log");
        let last = seen.last().expect("the service got the request");
        assert_eq!(last.version, version, "http2 = {http2}");
        assert_eq!(last.body, body.as_bytes());
        assert_eq!(
            last.headers.get("idempotency-key").map(|v| v.as_bytes()),
            Some(id.as_bytes())
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64;
        verifier
            .verify(&last.headers, &last.body, now)
            .expect("the Standard Webhooks signature verifies on the service's side");
    }
}

#[tokio::test]
async fn a_certificate_not_trusted_is_a_dependency_failure_and_reaches_nothing() {
    let service = start_tls_service().await;
    let url = format!("https://127.0.0.1:{}/hooks", service.addr.port());
    // No ca_file: the system's roots do not know the test's CA.
    let target = ForwardTarget::new(spec(url, None, false)).expect("an https target");
    let headers = Vec::new();
    let err = target
        .forward(&event("evt_untrusted", b"{}", &headers), 1, false)
        .await
        .expect_err("the handshake fails");
    assert!(err.is_dependency(), "{err}");
    assert_eq!(err.kind, "connection");
    assert!(
        err.message.to_lowercase().contains("certificate"),
        "the reason names the certificate: {err}"
    );
    assert!(
        service.seen.lock().expect("log").is_empty(),
        "no request reached the service"
    );
}

/// The connect check a breaker held open by connection failures uses: a
/// service listening is reachable; a closed port and a peer that accepts
/// and resets at once (a balancer with no backend) are not.
#[tokio::test]
async fn reachable_means_a_connection_that_stays_open() {
    let service = start_tls_service().await;
    let target = |port: u16| {
        ForwardTarget::new(spec(format!("https://127.0.0.1:{port}/hooks"), None, false))
            .expect("target")
    };
    assert!(target(service.addr.port()).reachable().await, "listening");

    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let closed_port = closed.local_addr().expect("addr").port();
    drop(closed);
    assert!(!target(closed_port).reachable().await, "a closed port");

    let resetting = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let resetting_port = resetting.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = resetting.accept().await {
            // Closed at once: the check sees the end of the stream.
            drop(stream);
        }
    });
    assert!(
        !target(resetting_port).reachable().await,
        "accepted and reset at once"
    );
}
