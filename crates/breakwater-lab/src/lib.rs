//! Breakwater's tooling, kept out of the service: the outage lab and the
//! benches. The `breakwater` binary runs them as `breakwater lab` and
//! `breakwater bench`; the service crate depends on none of this (no
//! plotters, no fault proxy, no naive consumer).
//!
//! - [`outage`]: `breakwater lab <scenario>` reproduces a database fault
//!   against a real PostgreSQL through a [`breakwater_faultproxy`] proxy,
//!   once with a naive consumer and once with Breakwater, and reports them
//!   side by side.
//! - [`naive`]: what makes the naive consumer naive (retries held inside
//!   the worker), as a wrapper around a sink.
//! - [`bench`]: `breakwater bench ingress` (bare hyper, Breakwater, and the
//!   write-and-fsync floor under the same load) and `bench drain` (workers
//!   vs pgbench).

pub mod backend;
pub mod bench;
pub mod naive;
pub mod outage;
