//! Ten thousand seeds of the simulation, every CI run: each draws its own
//! fault schedule, and every promise must hold in every one. A failure
//! names the seed and the command that replays it.

#[test]
fn ten_thousand_seeds_keep_every_promise() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let batch = breakwater_sim::run_many(0, 10_000, threads);
    println!("{batch}");
    assert!(
        batch.accepted > 1_000_000,
        "the seeds carried traffic: {batch}"
    );
    assert!(
        batch.transitions > 1_000,
        "the faults moved the breakers: {batch}"
    );
    assert!(
        batch.fleet_seeds > 1_000 && batch.leases_taken > batch.fleet_seeds,
        "fleet mode ran, and leases changed hands: {batch}"
    );
    assert!(batch.failed.is_empty(), "{batch}");
}

/// One seed replays exactly: the same schedule, the same outcome.
#[test]
fn a_seed_replays_exactly() {
    let (a, b) = (breakwater_sim::run(31), breakwater_sim::run(31));
    assert_eq!(
        (
            a.accepted,
            a.applied,
            a.dead_permanent,
            a.dead_exhausted,
            a.transitions,
            a.probes
        ),
        (
            b.accepted,
            b.applied,
            b.dead_permanent,
            b.dead_exhausted,
            b.transitions,
            b.probes
        )
    );
    assert!(a.transitions > 0, "seed 31 has an outage");
}
