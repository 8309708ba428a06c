//! CPU time of this process's named threads, read from `/proc` (Linux), so
//! `bench ingress` can say what the queue's own threads cost per webhook
//! and how long they waited for a CPU. Time on CPU (`schedstat`) does not
//! grow when the machine is busy, which makes it the steadier measure of
//! the writer's work across runs; the wait is what the busy machine adds.

use std::path::Path;

/// Time so far of the threads whose name starts with `prefix`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadTimes {
    /// Nanoseconds on a CPU.
    pub on_cpu_ns: u64,
    /// Nanoseconds runnable but waiting for a CPU.
    pub waiting_ns: u64,
}

/// The summed [`ThreadTimes`] of the threads whose name starts with
/// `prefix`; `None` when no such thread exists or `/proc` cannot say.
pub fn times(prefix: &str) -> Option<ThreadTimes> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut total: Option<ThreadTimes> = None;
    for task in tasks.flatten() {
        if let Some(t) = thread_times(&task.path(), prefix) {
            let sum = total.get_or_insert_with(ThreadTimes::default);
            sum.on_cpu_ns += t.on_cpu_ns;
            sum.waiting_ns += t.waiting_ns;
        }
    }
    total
}

fn thread_times(task: &Path, prefix: &str) -> Option<ThreadTimes> {
    let name = std::fs::read_to_string(task.join("comm")).ok()?;
    if !name.trim_end().starts_with(prefix) {
        return None;
    }
    // schedstat: time on CPU (ns), time waiting to run (ns), timeslices.
    let stat = std::fs::read_to_string(task.join("schedstat")).ok()?;
    let mut fields = stat.split_whitespace().map(str::parse::<u64>);
    Some(ThreadTimes {
        on_cpu_ns: fields.next()?.ok()?,
        waiting_ns: fields.next()?.ok()?,
    })
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
        let t = times("cpu-ns-probe").expect("the probe thread is found");
        // Twenty million dependent multiply-adds take milliseconds.
        assert!(t.on_cpu_ns > 1_000_000, "only {} ns on CPU", t.on_cpu_ns);
        assert_eq!(times("no-thread-has-this-name"), None);
        done_tx.send(()).expect("release");
        spinner.join().expect("join");
    }
}
