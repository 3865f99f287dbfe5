//! CPU time the processes under test spend over a drain, read from /proc: how a drain's CPU
//! divides between PostgreSQL (the postmaster and every backend, autovacuum included), the
//! scheduler, the executor and this benchmark's own clients. On a machine whose cores are all
//! busy, a drain's rate is the inverse of this sum, so the split says which process a change
//! must make cheaper (docs/performance.md, "what bounds it now").

use anyhow::{Context, Result};
use procfs::process::{all_processes, Process};

/// CPU seconds (user and system), per part of the stack.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuSplit {
    /// The postmaster, its live children and those it has reaped.
    pub(crate) postgres: f64,
    /// The scheduler process (0 when there is none).
    pub(crate) scheduler: f64,
    /// The executor process (0 when it was not running).
    pub(crate) executor: f64,
    /// This benchmark process: its gRPC and SQL clients share the cores with the rest.
    pub(crate) client: f64,
}

impl CpuSplit {
    /// What was spent between `earlier` and this reading.
    pub(crate) fn since(self, earlier: CpuSplit) -> CpuSplit {
        CpuSplit {
            postgres: self.postgres - earlier.postgres,
            scheduler: self.scheduler - earlier.scheduler,
            executor: self.executor - earlier.executor,
            client: self.client - earlier.client,
        }
    }

    /// The split as a note's clause, in core-seconds.
    pub(crate) fn describe(&self) -> String {
        format!(
            "CPU {:.2} core-s (PostgreSQL {:.2}, scheduler {:.2}, executor {:.2}, benchmark client {:.2})",
            self.postgres + self.scheduler + self.executor + self.client,
            self.postgres,
            self.scheduler,
            self.executor,
            self.client
        )
    }
}

/// Reads the CPU time of the PostgreSQL cluster a client is connected to, and of a scheduler.
pub(crate) struct CpuMeter {
    postmaster: i32,
    scheduler: Option<i32>,
}

impl CpuMeter {
    /// A meter for `scheduler` (if any) and the cluster `client` talks to (on this machine):
    /// the postmaster is the parent of the client's backend.
    pub(crate) async fn new(
        client: &tokio_postgres::Client,
        scheduler: Option<u32>,
    ) -> Result<Self> {
        let backend: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .context("reading the backend's pid")?
            .get(0);
        let postmaster = Process::new(backend)
            .and_then(|p| p.stat())
            .context("reading the backend's /proc entry: is PostgreSQL on this machine?")?
            .ppid;
        Ok(CpuMeter {
            postmaster,
            scheduler: scheduler.map(pid).transpose()?,
        })
    }

    /// The CPU seconds used so far, with `executor`'s when it runs.
    pub(crate) fn read(&self, executor: Option<u32>) -> Result<CpuSplit> {
        let ticks = procfs::ticks_per_second() as f64;
        let postmaster = Process::new(self.postmaster)
            .and_then(|p| p.stat())
            .context("reading the postmaster's /proc entry")?;
        // Reaped backends' time is in the postmaster's cutime/cstime; live ones are summed.
        let mut postgres = (postmaster.utime + postmaster.stime) as f64
            + (postmaster.cutime + postmaster.cstime) as f64;
        for process in all_processes().context("listing processes")?.flatten() {
            // A process that exits while being read is simply left out.
            if let Ok(stat) = process.stat() {
                if stat.ppid == self.postmaster {
                    postgres += (stat.utime + stat.stime) as f64;
                }
            }
        }
        let own = |pid: i32| -> Result<f64> {
            let stat = Process::new(pid)
                .and_then(|p| p.stat())
                .with_context(|| format!("reading /proc/{pid}/stat"))?;
            Ok((stat.utime + stat.stime) as f64)
        };
        Ok(CpuSplit {
            postgres: postgres / ticks,
            scheduler: match self.scheduler {
                Some(s) => own(s)? / ticks,
                None => 0.0,
            },
            executor: match executor {
                Some(e) => own(pid(e)?)? / ticks,
                None => 0.0,
            },
            client: own(pid(std::process::id())?)? / ticks,
        })
    }
}

fn pid(pid: u32) -> Result<i32> {
    i32::try_from(pid).context("a pid beyond i32")
}
