//! The results: one row per figure, printed as a table and written as JSON.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::Options;

/// One measured figure.
#[derive(Debug, Clone)]
pub struct Row {
    /// Scenario, e.g. `S1 drain`.
    pub scenario: String,
    /// What was measured, e.g. `tasks/s`.
    pub metric: String,
    /// The figure.
    pub value: f64,
    /// The plain-SQL figure for the same work in the same run, when there is one.
    pub baseline: Option<f64>,
    /// The target, in words (`>= 50 % of baseline`, `<= 10 ms`).
    pub target: String,
    /// Whether the target was met; None when there is no target.
    pub pass: Option<bool>,
}

impl Row {
    /// value / baseline.
    pub fn fraction(&self) -> Option<f64> {
        self.baseline.filter(|b| *b > 0.0).map(|b| self.value / b)
    }
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// The rows, in the order measured.
    pub rows: Vec<Row>,
    /// Settings and sizes, for the JSON.
    pub settings: Value,
    /// Free-form notes (load average, sizes), printed under the table.
    pub notes: Vec<String>,
}

impl Report {
    pub(crate) fn new(opts: &Options) -> Self {
        Report {
            rows: Vec::new(),
            settings: json!({
                "drain_tasks": opts.drain_tasks,
                "enqueue_tasks": opts.enqueue_tasks,
                "enqueue_clients": opts.enqueue_clients,
                "enqueue_batch": opts.enqueue_batch,
                "precision_tasks": opts.precision_tasks,
                "precision_window_s": opts.precision_window.as_secs_f64(),
                "scale_sizes": opts.scale_sizes,
                "scale_due": opts.scale_due,
                "max_in_flight": opts.max_in_flight,
                "claim_batch": opts.claim_batch,
                "baseline_workers": opts.baseline_workers,
                "baseline_batch": opts.baseline_batch,
                "pairs": opts.pairs,
            }),
            notes: Vec::new(),
        }
    }

    /// Adds a row with no baseline.
    pub(crate) fn add(
        &mut self,
        scenario: &str,
        metric: &str,
        value: f64,
        target: &str,
        pass: Option<bool>,
    ) {
        self.rows.push(Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            value,
            baseline: None,
            target: target.to_owned(),
            pass,
        });
    }

    /// Adds a row measured against a baseline; it passes at `min_fraction` of it.
    pub(crate) fn add_vs(
        &mut self,
        scenario: &str,
        metric: &str,
        value: f64,
        baseline: f64,
        min_fraction: f64,
    ) {
        let pass = baseline > 0.0 && value / baseline >= min_fraction;
        self.rows.push(Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            value,
            baseline: Some(baseline),
            target: format!(">= {:.0} % of baseline", min_fraction * 100.0),
            pass: Some(pass),
        });
    }

    /// Records a note printed under the table.
    pub(crate) fn note(&mut self, note: String) {
        eprintln!("[bench] {note}");
        self.notes.push(note);
    }

    /// The table as Markdown (it reads fine on a terminal too).
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| scenario | metric | herald | plain SQL | fraction | target | ok |"
        );
        let _ = writeln!(out, "| --- | --- | ---: | ---: | ---: | --- | --- |");
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.scenario,
                r.metric,
                number(r.value),
                r.baseline.map(number).unwrap_or_default(),
                r.fraction()
                    .map(|f| format!("{:.0} %", f * 100.0))
                    .unwrap_or_default(),
                r.target,
                match r.pass {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "",
                }
            );
        }
        for n in &self.notes {
            let _ = writeln!(out, "\n- {n}");
        }
        out
    }

    /// The report as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "settings": self.settings,
            "rows": self.rows.iter().map(|r| json!({
                "scenario": r.scenario,
                "metric": r.metric,
                "value": r.value,
                "baseline": r.baseline,
                "fraction": r.fraction(),
                "target": r.target,
                "pass": r.pass,
            })).collect::<Vec<_>>(),
            "notes": self.notes,
        })
    }
}

/// A figure with sensible precision: integers for large values, decimals for small ones.
fn number(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
