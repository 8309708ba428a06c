//! Breakwater: a webhook ingress gateway with a dynamic ingestion circuit
//! breaker. This crate is the service; the `breakwater` binary is the
//! `breakwater-cli` crate, the lab and benches `breakwater-lab`.
//!
//! The modules follow the flow of one webhook (see ARCHITECTURE.md):
//! [`ingress`] verifies and enqueues, [`queue`] opens the configured
//! backend of the queue contract, [`worker`] applies messages to the sink
//! under the gate of the [`breaker`]. [`config`] and [`source`] describe
//! what to accept; [`admin`] is the operator's view; [`serve`] wires it all
//! into a running process.

pub mod admin;
pub mod breaker;
pub mod config;
pub mod doctor;
pub mod events;
pub mod http;
pub mod ingress;
pub mod queue;
pub mod serve;
pub mod source;
pub mod telemetry;
pub mod worker;
