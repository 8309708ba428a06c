//! What the lab's pipeline writes to, and how the lab reads it: the
//! scratch schema of a real PostgreSQL (`--sink db`, the default) or the
//! lab's own HTTP service (`--sink http`, [`LabService`]).
//!
//! Every figure the sampler and the report need is asked of a
//! [`Dependency`]: what was applied (hot order, others), who waits and who
//! works, how long an unrelated client's probe takes, and the lag of the
//! unrelated events sent during the fault.

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::driver::{HOT_ORDER, UNRELATED_ORDERS};
use super::service::LabService;

/// The database side: a scratch schema and a session of the lab's own,
/// straight to PostgreSQL (not through the fault proxy).
pub(super) struct Database {
    pub(super) url: String,
    pub(super) schema: String,
    /// The pipeline's `application_name`, to find its sessions.
    pub(super) app_name: String,
    pub(super) direct: tokio_postgres::Client,
}

pub(super) enum Dependency {
    Database(Database),
    Service {
        service: LabService,
        client: Client<HttpConnector, Full<Bytes>>,
    },
}

impl Dependency {
    /// A fresh scratch schema `bw_lab_<tag>` with the orders table.
    pub(super) async fn database(url: &str, tag: &str) -> anyhow::Result<Self> {
        let schema = format!("bw_lab_{tag}");
        let direct = super::connect(url).await?;
        direct
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
                 CREATE TABLE {schema}.orders (
                     id bigint PRIMARY KEY,
                     status text NOT NULL CHECK (status <> 'poison'),
                     updated_at timestamptz);
                 INSERT INTO {schema}.orders (id, status)
                     SELECT g, 'new' FROM generate_series(1, {UNRELATED_ORDERS}) g;
                 INSERT INTO {schema}.orders (id, status) VALUES ({HOT_ORDER}, 'new');"
            ))
            .await
            .context("cannot create the lab's scratch schema")?;
        Ok(Self::Database(Database {
            url: url.to_owned(),
            schema,
            app_name: format!("bw_lab_{tag}"),
            direct,
        }))
    }

    /// The lab's HTTP service, listening.
    pub(super) async fn service() -> anyhow::Result<Self> {
        Ok(Self::Service {
            service: LabService::start().await?,
            client: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    /// Removes what [`Self::database`] made; stops the service.
    pub(super) async fn remove(self) {
        match self {
            Self::Database(db) => {
                let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", db.schema);
                if let Err(e) = db.direct.batch_execute(&drop).await {
                    tracing::warn!(error = %e, schema = %db.schema, "cannot drop the lab schema");
                }
            }
            Self::Service { service, .. } => service.shutdown(),
        }
    }

    /// Applied so far: (hot order, the others).
    pub(super) async fn applied(&self) -> (u64, u64) {
        match self {
            Self::Database(db) => db
                .direct
                .query_one(
                    &format!(
                        "SELECT count(*) FILTER (WHERE entity_key = '{HOT_ORDER}'),
                                count(*) FILTER (WHERE entity_key IS DISTINCT FROM '{HOT_ORDER}')
                         FROM {}.breakwater_inbox",
                        db.schema
                    ),
                    &[],
                )
                .await
                .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64))
                .unwrap_or((0, 0)),
            Self::Service { service, .. } => service.delivered(),
        }
    }

    /// (sessions waiting on a lock, sessions in use) of the pipeline; for
    /// the service, (0, webhook requests it holds unanswered).
    pub(super) async fn activity(&self) -> (u64, u64) {
        match self {
            Self::Database(db) => db
                .direct
                .query_one(
                    "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),
                            count(*) FILTER (WHERE state <> 'idle')
                     FROM pg_stat_activity WHERE application_name = $1",
                    &[&db.app_name],
                )
                .await
                .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64))
                .unwrap_or((0, 0)),
            Self::Service { service, .. } => (0, service.held()),
        }
    }

    /// An unrelated client's latency, milliseconds: a small query of the
    /// lab's own (`SELECT count(*)` over 100 orders), or the service's
    /// `GET /probe` (through the same workers as the webhooks).
    pub(super) async fn probe(&self) -> Option<f64> {
        match self {
            Self::Database(db) => {
                let sql = format!("SELECT count(*) FROM {}.orders WHERE id <= 100", db.schema);
                let started = std::time::Instant::now();
                db.direct
                    .query_one(&sql, &[])
                    .await
                    .ok()
                    .map(|_| started.elapsed().as_secs_f64() * 1000.0)
            }
            Self::Service { service, client } => {
                super::service::time_probe(client, service.addr()).await
            }
        }
    }

    /// Everything applied, read at the end.
    pub(super) async fn applied_total(&self) -> anyhow::Result<u64> {
        let (hot, others) = match self {
            Self::Database(db) => {
                let n: i64 = db
                    .direct
                    .query_one(
                        &format!("SELECT count(*) FROM {}.breakwater_inbox", db.schema),
                        &[],
                    )
                    .await?
                    .get(0);
                (0, n as u64)
            }
            Self::Service { service, .. } => service.delivered(),
        };
        Ok(hot + others)
    }

    /// p50 and p99 (milliseconds) of the lag of the unrelated events
    /// received in `[from_ms, to_ms)` (wall clock), and how many there
    /// were: from the ingress's receipt to the inbox row's commit, or from
    /// the driver's send to the service's first 2xx.
    pub(super) async fn unrelated_lag(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> (Option<f64>, Option<f64>, u64) {
        match self {
            Self::Database(db) => db
                .direct
                .query_one(
                    &format!(
                        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
                                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms),
                                count(*)
                         FROM (SELECT extract(epoch FROM applied_at - received_at) * 1000 AS ms
                               FROM {}.breakwater_inbox
                               WHERE entity_key IS DISTINCT FROM '{HOT_ORDER}'
                                 AND received_at >= to_timestamp($1::float8 / 1000)
                                 AND received_at <  to_timestamp($2::float8 / 1000)) s",
                        db.schema
                    ),
                    &[&(from_ms as f64), &(to_ms as f64)],
                )
                .await
                .map(|r| {
                    (
                        r.get::<_, Option<f64>>(0),
                        r.get::<_, Option<f64>>(1),
                        r.get::<_, i64>(2) as u64,
                    )
                })
                .unwrap_or((None, None, 0)),
            Self::Service { service, .. } => {
                let lags = service.unrelated_lags(from_ms, to_ms);
                let n = lags.len() as u64;
                (
                    super::report::quantile(lags.clone(), 0.5),
                    super::report::quantile(lags, 0.99),
                    n,
                )
            }
        }
    }
}
