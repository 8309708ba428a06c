//! Which admin API a command talks to: `--admin HOST:PORT` (a service on
//! another host), else the config's `[admin] listen`; with the config's
//! `[admin] token` (`BREAKWATER_ADMIN_TOKEN`) either way.

use std::net::SocketAddr;

use anyhow::Context;
use breakwater::admin::client::{self, AdminClientError};
use breakwater::config::Config;
use http::Method;

/// `--admin`, on the commands that go through the admin API.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct AdminArg {
    /// The admin API to ask, e.g. `worker-3.internal:9090`. Default: the
    /// config's `[admin] listen`, with no fallback to the local queue when
    /// set. The token is the config's `[admin] token`
    /// (BREAKWATER_ADMIN_TOKEN).
    #[arg(long, global = true, value_name = "HOST:PORT")]
    pub(crate) admin: Option<String>,
}

/// An admin API and its token.
#[derive(Debug, Clone)]
pub(crate) struct AdminTarget {
    pub(crate) addr: SocketAddr,
    token: Option<String>,
    /// Named with `--admin`: a command never falls back to opening the
    /// queue here instead.
    pub(crate) named: bool,
}

impl AdminTarget {
    /// The API `arg` names (resolved), else the config's.
    pub(crate) async fn resolve(config: &Config, arg: &AdminArg) -> anyhow::Result<Self> {
        let token = config.admin.token.clone();
        let Some(named) = &arg.admin else {
            return Ok(Self {
                addr: config.admin.listen,
                token,
                named: false,
            });
        };
        let addr = tokio::net::lookup_host(named.as_str())
            .await
            .with_context(|| format!("--admin {named}: not a HOST:PORT that resolves"))?
            .next()
            .with_context(|| format!("--admin {named}: the name resolves to no address"))?;
        Ok(Self {
            addr,
            token,
            named: true,
        })
    }

    pub(crate) async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path_and_query: &str,
    ) -> Result<T, AdminClientError> {
        client::call(self.addr, self.token.as_deref(), method, path_and_query).await
    }

    pub(crate) async fn call_with<T: serde::de::DeserializeOwned, B: serde::Serialize>(
        &self,
        method: Method,
        path_and_query: &str,
        body: &B,
    ) -> Result<T, AdminClientError> {
        client::call_with(
            self.addr,
            self.token.as_deref(),
            method,
            path_and_query,
            Some(body),
        )
        .await
    }

    /// Whether `e` says no service answers here, and this target was not
    /// named (so the command may open the queue itself instead).
    pub(crate) fn may_fall_back(&self, e: &anyhow::Error) -> bool {
        !self.named
            && e.downcast_ref::<AdminClientError>()
                .is_some_and(|e| matches!(e, AdminClientError::Unreachable { .. }))
    }
}

/// `text` as a query-string value.
pub(crate) fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `id` as one path segment (an id is the backend's, an event id the
/// issuer's: keep `/`, `?` and `%` from changing the path).
pub(crate) fn path_segment(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'%') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
