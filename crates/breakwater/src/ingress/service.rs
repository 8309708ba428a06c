//! The ingress as its listener serves it: `POST /webhooks/{name}` handled
//! straight from hyper's request, everything else through the axum router.
//!
//! Every webhook is on this path, and under `bench ingress` axum's share
//! of it (the router's clone and boxed service, the path parameters put
//! into the request's extensions and decoded, the header map cloned for
//! the `HeaderMap` extractor, the body boxed, the handler's future boxed)
//! was a seventh of the server threads' time (`perf`, 2026-12-03), more
//! than verifying the signature. So [`IngressService`] reads the source's
//! name from the path itself and calls the same handler the router does
//! ([`super::take`]), with the same answers, limits and metrics. A path it
//! does not take whole (another method, a name with `%` or `/` in it, any
//! other path) goes to the router, which answers as it always has.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use tower::{Service, ServiceExt};

use super::{Ingress, IngressError};

/// What the ingress listener serves: see the module doc. Cheap to clone
/// (one per connection).
#[derive(Clone)]
pub struct IngressService {
    ingress: Arc<Ingress>,
    router: Router,
}

impl IngressService {
    pub(super) fn new(ingress: Ingress) -> Self {
        let ingress = Arc::new(ingress);
        let router = Ingress::router_on(Arc::clone(&ingress));
        Self { ingress, router }
    }
}

/// The source named by a webhook's path, when it is one this service takes
/// itself: `/webhooks/` and a name with no `/` (another segment) and no
/// `%` (an escape the router decodes).
fn webhook_source<'a>(method: &Method, path: &'a str) -> Option<&'a str> {
    let name = path.strip_prefix("/webhooks/")?;
    let plain = !name.is_empty() && !name.contains(['/', '%']);
    (method == Method::POST && plain).then_some(name)
}

/// Reads the whole body within `limit` bytes.
async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, IngressError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(IngressError::TooLarge { limit })
        }
        Err(e) => Err(IngressError::BadBody(format!(
            "Failed to buffer the request body: {e}"
        ))),
    }
}

impl Service<Request<Incoming>> for IngressService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let Some(name) = webhook_source(req.method(), req.uri().path()) else {
            let router = self.router.clone();
            return Box::pin(router.oneshot(req.map(Body::new)));
        };
        // The name outlives the request's parts only as a copy: a few bytes.
        let name = name.to_owned();
        let ingress = Arc::clone(&self.ingress);
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = read_body(body, ingress.max_body_bytes).await;
            Ok(super::take(&ingress, &name, &parts.headers, body).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_post_to_one_plain_name_is_taken_here() {
        let post = Method::POST;
        assert_eq!(webhook_source(&post, "/webhooks/stripe"), Some("stripe"));
        assert_eq!(webhook_source(&post, "/webhooks/a-b_c.1"), Some("a-b_c.1"));
        // The router answers these, as it always has.
        assert_eq!(webhook_source(&Method::GET, "/webhooks/stripe"), None);
        assert_eq!(webhook_source(&post, "/webhooks/"), None);
        assert_eq!(webhook_source(&post, "/webhooks/stripe/"), None);
        assert_eq!(webhook_source(&post, "/webhooks/a/b"), None);
        assert_eq!(webhook_source(&post, "/webhooks/str%69pe"), None);
        assert_eq!(webhook_source(&post, "/healthz"), None);
        assert_eq!(webhook_source(&post, "/webhook/stripe"), None);
    }
}
