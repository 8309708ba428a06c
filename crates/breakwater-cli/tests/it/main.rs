//! Integration tests: the real binary over real sockets, and (for the
//! sink and worker tests) a real PostgreSQL. One test binary, modules per
//! area, helpers in `utils`.

#![allow(unreachable_pub)]

mod admin;
mod cli;
mod crash;
mod dashboard;
mod doctor;
mod events;
mod fault_matrix;
mod files;
mod fleet;
mod forward;
mod ingress;
mod kafka;
mod key_order;
mod lab;
mod logs;
mod nats;
mod orders;
mod own_brokers;
mod own_pg;
mod pg;
mod rabbitmq;
mod receiver;
mod sqs;
mod stale;
mod utils;
mod worker;
