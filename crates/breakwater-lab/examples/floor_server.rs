//! Serves one of `bench ingress`'s reference servers on its own, so a load
//! tool outside the process (`scripts/bench-outside.sh` drives `wrk`) can
//! measure it beside `breakwater serve`:
//!
//! - `bare`: hyper answering `200 ok` to anything;
//! - `lean`: the lean floor (`breakwater_lab::bench::lean`): the Stripe
//!   signature checked, the body appended to a preallocated ring file and
//!   `fdatasync`ed once per group before the answer;
//! - `append`: the same, appending to a file that grows instead of a ring.
//!
//! ```sh
//! cargo run --release -p breakwater-lab --example floor_server -- lean /tmp/lean.log
//! ```
//!
//! It prints `listening on ADDR` once it takes connections and serves until
//! killed. The lean floor's secret is `bench ingress`'s
//! ([`breakwater_lab::bench::BENCH_SECRET`]).

use std::path::PathBuf;

use anyhow::{Context, bail};
use breakwater_lab::bench::lean::{self, LeanFile};
use breakwater_lab::bench::{BENCH_SECRET, start_bare_hyper};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async move {
        let addr = match kind.as_str() {
            "bare" => start_bare_hyper().await?,
            "lean" | "append" => {
                let file: PathBuf = args
                    .next()
                    .context("usage: floor_server lean|append FILE")?
                    .into();
                let how = if kind == "lean" {
                    LeanFile::Ring
                } else {
                    LeanFile::Append
                };
                lean::start_on(&file, BENCH_SECRET, how).await?
            }
            other => bail!("usage: floor_server bare | lean FILE | append FILE (got {other:?})"),
        };
        println!("listening on {addr}");
        std::future::pending::<()>().await;
        Ok(())
    })
}
