//! The runtime the workers run on in a process that also takes webhooks
//! (`serve --role all`, the default): its threads run at a lower CPU
//! priority than the ingress's, by `workers.nice`.
//!
//! On a small machine the applies' CPU comes out of the ingress's: on two
//! cores, a flood of webhooks into `serve` accepted about a quarter less
//! while its workers applied them than with its breaker tripped
//! (`docs/measurements.md`, "Ingress first"). Under a flood the ingress is
//! the part someone waits on (a sender holds its connection until the 2xx);
//! an apply can wait in the durable queue. With the workers on threads of
//! their own at a higher nice value, the kernel's scheduler gives the CPU
//! to the ingress first and the applies take what is left: at nice 10
//! against busy nice-0 threads about a tenth of a core each, never nothing,
//! and all of it once the flood ends, when the backlog drains at full
//! speed. With CPU to spare the nice value changes nothing. This is the
//! kernel's work-conserving priority rather than a pacing rule of our own:
//! no signal to read, no rate to guess.
//!
//! What runs here: the dispatcher, every apply it spawns, and the blocking
//! threads those use (the SQLite sink's group commits). The queue's writer,
//! the breaker's controller and the database connections' drivers stay on
//! the main runtime.
//!
//! Linux only, where the nice value is a thread's own (elsewhere
//! `setpriority` would lower the whole process): there, and with
//! `workers.nice = 0`, the workers share the ingress's runtime.

use tokio::runtime::{Builder, Handle, Runtime};

/// The highest (least favoured) nice value.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const MAX_NICE: i32 = 19;

/// The workers' runtime; shut down in the background when dropped.
pub struct ApplyRuntime {
    runtime: Option<Runtime>,
}

impl ApplyRuntime {
    /// A runtime whose threads run `nice` steps below this thread's
    /// priority, or `None` when there is nothing to lower (`nice` 0, or not
    /// Linux).
    pub fn start(nice: u8) -> std::io::Result<Option<Self>> {
        if nice == 0 || !cfg!(target_os = "linux") {
            return Ok(None);
        }
        // One value for every thread, from the caller's: a thread the
        // runtime starts from one of its own (a blocking thread) inherits
        // the lowered value, and lowering it again would go too far.
        let target = this_thread_nice().map(|now| (now + i32::from(nice)).min(MAX_NICE));
        let runtime = Builder::new_multi_thread()
            .thread_name("bw-apply")
            .on_thread_start(move || {
                if let Some(target) = target {
                    set_this_thread(target);
                }
            })
            .enable_all()
            .build()?;
        Ok(Some(Self {
            runtime: Some(runtime),
        }))
    }

    /// Where to spawn the workers' tasks.
    pub fn handle(&self) -> Option<&Handle> {
        self.runtime.as_ref().map(Runtime::handle)
    }
}

impl Drop for ApplyRuntime {
    fn drop(&mut self) {
        // Dropping a runtime may not block inside another one (`serve`
        // drops this from async code): its tasks have ended by then
        // (`Running::shutdown`), so nothing is left to wait for.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Sets the calling thread's nice value to `nice`. On Linux a
/// `setpriority(PRIO_PROCESS, 0)` concerns the calling thread only, and
/// threads it starts inherit the value. Raising it needs no privilege.
#[cfg(target_os = "linux")]
fn set_this_thread(nice: i32) {
    if let Err(error) = rustix::process::setpriority_process(None, nice) {
        tracing::warn!(%error, "cannot lower a worker thread's CPU priority; it runs at the ingress's");
    }
}

#[cfg(not(target_os = "linux"))]
fn set_this_thread(_nice: i32) {}

/// This thread's nice value (Linux).
#[cfg(target_os = "linux")]
pub fn this_thread_nice() -> Option<i32> {
    rustix::process::getpriority_process(None).ok()
}

#[cfg(not(target_os = "linux"))]
pub fn this_thread_nice() -> Option<i32> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn its_threads_run_at_the_lowered_priority_and_others_do_not() {
        let base = this_thread_nice();
        let rt = ApplyRuntime::start(10)
            .expect("runtime")
            .expect("Linux lowers the workers");
        let handle = rt.handle().expect("running").clone();
        let on_worker = handle.block_on(async { tokio::spawn(async { this_thread_nice() }).await });
        let on_blocking =
            handle.block_on(async { tokio::task::spawn_blocking(this_thread_nice).await });
        // A blocking thread started from one of the runtime's own threads
        // (as the SQLite sink's are, from an apply task) inherits the
        // lowered value: it must not be lowered twice.
        let nested = handle.block_on(async {
            tokio::spawn(async {
                let blocked: Vec<_> = (0..4)
                    .map(|_| {
                        tokio::task::spawn_blocking(|| {
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            this_thread_nice()
                        })
                    })
                    .collect();
                let mut nices = Vec::new();
                for b in blocked {
                    nices.push(b.await.expect("blocking task"));
                }
                nices
            })
            .await
        });
        let base = base.expect("nice value");
        let want = (base + 10).min(MAX_NICE);
        assert_eq!(on_worker.expect("task"), Some(want), "a worker thread");
        assert_eq!(on_blocking.expect("task"), Some(want), "a blocking thread");
        assert_eq!(
            nested.expect("task"),
            vec![Some(want); 4],
            "blocking threads started from a worker thread"
        );
        assert_eq!(this_thread_nice(), Some(base), "the caller is untouched");
    }

    #[test]
    fn nice_zero_makes_no_runtime() {
        assert!(ApplyRuntime::start(0).expect("no error").is_none());
    }
}
