//! Breakwater: a webhook ingress gateway with a dynamic ingestion circuit
//! breaker.
//!
//! The modules follow the flow of one webhook (see ARCHITECTURE.md):
//! [`ingress`] verifies and enqueues, [`queue`] keeps it durable, and the
//! workers apply it to the sink under the breaker's gate. [`config`] and
//! [`source`] describe what to accept; [`admin`] is the operator's view;
//! [`serve`] wires it all into a running process.

pub mod admin;
pub mod bench;
pub mod config;
pub mod ingress;
pub mod lab;
pub mod queue;
pub mod serve;
pub mod source;
pub mod telemetry;
pub mod worker;
