//! `breakwater bench send`: a steady stream of signed Stripe-style webhooks
//! at a fixed rate (the lab's driver, open loop) against a running
//! Breakwater, with its counts each `--report-every` and at the end. The
//! soak (`scripts/soak.sh`) drives the service with it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::outage::driver::{DriveCounters, DriveSpec, drive};

/// `bench send`.
#[derive(Debug, Clone, clap::Args)]
pub struct SendArgs {
    /// The ingress URL of a Stripe-scheme source, e.g.
    /// http://127.0.0.1:8080/webhooks/stripe.
    #[arg(long)]
    pub url: String,
    /// The source's signing secret.
    #[arg(long, env = "BREAKWATER_SEND_SECRET")]
    pub secret: String,
    /// Webhooks per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// How long, seconds.
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Share of webhooks for the hot order (1042).
    #[arg(long, default_value_t = 0.0)]
    pub hot_share: f64,
    /// Prints the counts this often, seconds.
    #[arg(long, default_value_t = 60)]
    pub report_every: u64,
    /// Makes the event ids unique to this run.
    #[arg(long, default_value = "send")]
    pub tag: String,
}

/// Sends the stream; returns (sent, accepted, refused).
pub async fn run_send(args: &SendArgs) -> anyhow::Result<(u64, u64, u64)> {
    anyhow::ensure!(
        args.rate.is_finite() && args.rate > 0.0,
        "--rate must be above 0"
    );
    let counters = Arc::new(DriveCounters::default());
    let spec = DriveSpec {
        url: args.url.clone(),
        secret: args.secret.clone(),
        rate: args.rate,
        duration: Duration::from_secs(args.duration),
        hot_share: args.hot_share,
        poison_share: 0.0,
        tag: args.tag.clone(),
    };
    let read = |c: &DriveCounters| {
        (
            c.sent.load(Ordering::Relaxed),
            c.accepted.load(Ordering::Relaxed),
            c.refused.load(Ordering::Relaxed),
        )
    };
    let mut driver = tokio::spawn(drive(spec, Arc::clone(&counters)));
    let mut every = tokio::time::interval(Duration::from_secs(args.report_every.max(1)));
    every.tick().await;
    loop {
        tokio::select! {
            done = &mut driver => {
                done?;
                break;
            }
            _ = every.tick() => {
                let (sent, accepted, refused) = read(&counters);
                eprintln!("sent {sent}, accepted {accepted}, refused {refused}");
            }
        }
    }
    Ok(read(&counters))
}
