//! The real scheduler binary starts on a fresh database (running its migrations) and reports
//! SERVING on the standard gRPC health service.

use anyhow::Result;
use herald_tests::{connect_health, ExecutorProcess, SchedulerProcess, TestDb};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::HealthCheckRequest;

#[tokio::test]
async fn scheduler_reports_serving() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut health = connect_health(&scheduler.grpc_url()).await?;

    // The empty service name is the server as a whole, as Kubernetes probes ask it.
    let response = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    assert_eq!(response.status(), ServingStatus::Serving);
    Ok(())
}

#[tokio::test]
async fn scheduler_stops_on_sigterm() -> Result<()> {
    let db = TestDb::new().await?;
    let mut scheduler = SchedulerProcess::spawn(&db).await?;
    scheduler.terminate()?;
    let status = scheduler.wait().await?;
    assert!(status.success(), "exit status {status}");
    Ok(())
}

#[tokio::test]
async fn executor_starts_against_a_scheduler() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .spawn()
        .await?;
    assert!(executor.http_url().starts_with("http://127.0.0.1:"));
    executor.terminate()?;
    let status = executor.wait().await?;
    assert!(status.success(), "exit status {status}");
    Ok(())
}
