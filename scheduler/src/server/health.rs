//! grpc.health.v1 for every service the replica serves, set together: SERVING once migrations
//! ran, following the database while it runs (`db_watch`), NOT_SERVING from the start of the
//! shutdown.

use herald_proto::v1::{
    account_service_server, audience_service_server, campaign_service_server, lease_service_server,
    schedule_service_server, stats_service_server, suppression_service_server, task_service_server,
    template_service_server,
};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::db_watch::{DatabaseReachable, DbWatch};
use crate::store::Store;

/// Every name health answers for: the server as a whole (`""`) and each herald service.
pub(super) const SERVED: &[&str] = &[
    "",
    task_service_server::SERVICE_NAME,
    template_service_server::SERVICE_NAME,
    account_service_server::SERVICE_NAME,
    schedule_service_server::SERVICE_NAME,
    campaign_service_server::SERVICE_NAME,
    audience_service_server::SERVICE_NAME,
    lease_service_server::SERVICE_NAME,
    stats_service_server::SERVICE_NAME,
    suppression_service_server::SERVICE_NAME,
];

/// The replica's health reporting.
pub(super) struct Health {
    reporter: HealthReporter,
    watch: DbWatch,
}

impl Health {
    /// Reports every service SERVING and starts following the database; returns the health
    /// service to serve.
    pub(super) async fn start(
        store: &Store,
    ) -> (
        Self,
        tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    ) {
        let (reporter, service) = tonic_health::server::health_reporter();
        set_all(&reporter, ServingStatus::Serving).await;
        let watch = DbWatch::spawn(store.target().clone(), reporter.clone(), SERVED);
        (Health { reporter, watch }, service)
    }

    /// Whether the database answers, for refusing lease streams while it does not.
    pub(super) fn database(&self) -> DatabaseReachable {
        self.watch.reachable()
    }

    /// Stops following the database and reports every service NOT_SERVING.
    pub(super) async fn shut_down(self) {
        self.watch.stop().await;
        set_all(&self.reporter, ServingStatus::NotServing).await;
    }
}

async fn set_all(reporter: &HealthReporter, status: ServingStatus) {
    for service in SERVED {
        reporter.set_service_status(*service, status).await;
    }
}
