//! Runs every benchmark scenario at tiny sizes against the harness's database and debug
//! binaries: proves the benchmark still works, without asserting anything about speed (figures
//! from a debug build on a shared machine mean nothing).

use std::time::Duration;

use herald_bench::{run, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_runs_at_tiny_sizes() {
    let opts = Options {
        drain_tasks: 300,
        enqueue_tasks: 400,
        enqueue_batch: 100,
        precision_tasks: 20,
        precision_window: Duration::from_secs(1),
        scale_sizes: vec![1_000, 3_000],
        scale_due: 100,
        scale_probes: 3,
        max_in_flight: 64,
        soak_unit: Duration::from_secs(1),
        soak_rate: Some(200.0),
        // Two: each side goes first once.
        pairs: 2,
        ..Options::quick()
    };
    let report = run(&opts).await.expect("benchmark run");
    for scenario in [
        "S1 drain",
        "S2 enqueue",
        "S3 precision",
        "S4 scale 1k",
        "S4 scale 3k",
        "S5 100 accounts",
        "S6 soak",
        "S7 careful pacing",
    ] {
        assert!(
            report.rows.iter().any(|r| r.scenario == scenario),
            "no row for {scenario}:\n{}",
            report.table()
        );
    }
    for row in &report.rows {
        assert!(row.value.is_finite(), "{row:?}");
    }
    let early = report
        .rows
        .iter()
        .find(|r| r.scenario == "S3 precision" && r.metric == "fired early")
        .expect("early count");
    // Not a timing assertion: a task leased before its run_at is a correctness bug at any speed.
    assert_eq!(early.value, 0.0, "{}", report.table());
    let s6 = |metric: &str| {
        report
            .rows
            .iter()
            .find(|r| r.scenario == "S6 soak" && r.metric == metric)
            .map(|r| r.value)
            .unwrap_or_else(|| panic!("no S6 row {metric}:\n{}", report.table()))
    };
    // The sizes and the held transaction come from the scheduler's own gauges
    // (herald_table_bytes, herald_oldest_transaction_seconds): the soak holds its transaction
    // two units (2 s here) before it scrapes, so the gauge must show at least that long.
    assert!(
        s6("tasks+attempts size before (MiB)") > 0.0,
        "{}",
        report.table()
    );
    assert!(
        s6("oldest transaction at the end, held (s)") >= 1.0,
        "{}",
        report.table()
    );
    // The backlog at each phase's end, from the live-task gauge (never negative, present).
    assert!(
        s6("tasks waiting at the end, after") >= 0.0,
        "{}",
        report.table()
    );
    // The compactor's rewrites in each phase (none in a tiny soak: its tables are too small).
    assert!(
        s6("tables rewritten by the compactor, after") >= 0.0,
        "{}",
        report.table()
    );
    assert!(report.to_json()["rows"].is_array());
}
