//! Reading a service's `GET /metrics`: the body, and one series' value in it.

use anyhow::{Context, Result};

/// The body of a service's `GET /metrics` at `http_url`.
pub async fn scrape(http_url: &str) -> Result<String> {
    reqwest::get(format!("{http_url}/metrics"))
        .await
        .context("GET /metrics")?
        .error_for_status()?
        .text()
        .await
        .context("reading /metrics")
}

/// The value of the series `name{labels}` in a Prometheus text body (`labels` as rendered,
/// without braces; empty for an unlabelled series).
pub fn series(body: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    body.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}
