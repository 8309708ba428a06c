//! The breaker as the service runs it: [`controller`] owns the pure
//! breaker of `breakwater-control`, feeds it the sampled signals, publishes
//! its gate and logs every transition. Only a process that runs workers
//! has one, and any process of a fleet (an ingress node follows the
//! fleet's for its admin API); an ingress never waits on the breaker.
//!
//! The controller shares its breaker through the async seams of
//! `breakwater_control::coordination` ([`Coordination`]): after every
//! transition the breaker's state is stored as a record by compare-and-set,
//! and a half-open probe takes a fleet slot (of the same half-open period)
//! before the breaker's own. One node uses the in-memory stores; with
//! `[fleet]`, [`fleet`] links the controller to the Redis store: one node
//! (the lease holder) evaluates, every node follows the shared record.

pub mod controller;
pub mod fleet;

pub use self::controller::{
    Controller, Coordination, LOCK_WAIT_AFTER, Probe, SlotGuard, Slots, Standing,
};
pub use self::fleet::FleetLink;
