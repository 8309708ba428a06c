//! CPU time of this process's named threads, read from `/proc` (Linux), so
//! `bench ingress` can say what the queue's own threads cost per webhook.
//! The figure is time on CPU (`schedstat`), not wall time: it does not grow
//! when the machine is busy, which makes it the steadier measure of the
//! writer's work across runs.

use std::path::Path;

/// Nanoseconds on CPU, so far, of the threads whose name starts with
/// `prefix`; `None` when no such thread exists or `/proc` cannot say.
pub fn cpu_ns(prefix: &str) -> Option<u64> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut total = None;
    for task in tasks.flatten() {
        if let Some(ns) = thread_cpu_ns(&task.path(), prefix) {
            *total.get_or_insert(0) += ns;
        }
    }
    total
}

fn thread_cpu_ns(task: &Path, prefix: &str) -> Option<u64> {
    let name = std::fs::read_to_string(task.join("comm")).ok()?;
    if !name.trim_end().starts_with(prefix) {
        return None;
    }
    // schedstat: time on CPU (ns), time waiting to run (ns), timeslices.
    std::fs::read_to_string(task.join("schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_cpu_time_of_named_threads_only() {
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let (spun_tx, spun_rx) = std::sync::mpsc::channel::<u64>();
        let spinner = std::thread::Builder::new()
            .name("cpu-ns-probe".into())
            .spawn(move || {
                let mut x: u64 = 1;
                for i in 0..20_000_000u64 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                }
                spun_tx.send(x).expect("send");
                let _ = done_rx.recv();
            })
            .expect("spawn");
        spun_rx.recv().expect("spun");
        let ns = cpu_ns("cpu-ns-probe").expect("the probe thread is found");
        // Twenty million dependent multiply-adds take milliseconds.
        assert!(ns > 1_000_000, "only {ns} ns on CPU");
        assert_eq!(cpu_ns("no-thread-has-this-name"), None);
        done_tx.send(()).expect("release");
        spinner.join().expect("join");
    }
}
