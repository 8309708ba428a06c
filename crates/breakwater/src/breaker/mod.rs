//! The breaker as the service runs it: [`controller`] owns the pure
//! breaker of `breakwater-control`, feeds it the sampled signals, publishes
//! its gate and logs every transition. Only a process that runs workers
//! has one; an ingress-only process never waits on the breaker.

pub mod controller;

pub use self::controller::{Controller, LOCK_WAIT_AFTER, SlotGuard, Slots};
