//! The gRPC server: every service, reflection and health on one listener, behind the auth
//! layer, each tower layer with its reason.

use std::sync::Arc;
use std::time::Duration;

use herald_proto::v1::account_service_server::AccountServiceServer;
use herald_proto::v1::audience_service_server::AudienceServiceServer;
use herald_proto::v1::campaign_service_server::CampaignServiceServer;
use herald_proto::v1::lease_service_server::LeaseServiceServer;
use herald_proto::v1::schedule_service_server::ScheduleServiceServer;
use herald_proto::v1::stats_service_server::StatsServiceServer;
use herald_proto::v1::suppression_service_server::SuppressionServiceServer;
use herald_proto::v1::task_service_server::TaskServiceServer;
use herald_proto::v1::template_service_server::TemplateServiceServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic::server::NamedService;
use tower::Service;

use super::{Replica, ServeError};
use crate::api::accounts::AccountApi;
use crate::api::audiences::AudienceApi;
use crate::api::campaigns::CampaignApi;
use crate::api::lease::LeaseApi;
use crate::api::schedules::ScheduleApi;
use crate::api::stats::StatsApi;
use crate::api::suppressions::SuppressionApi;
use crate::api::tasks::TaskApi;
use crate::api::templates::TemplateApi;
use crate::audiences::Audiences;
use crate::auth::layer::{AuthLayer, AuthPolicy};
use crate::campaigns::Campaigns;
use crate::config::Config;
use crate::lease::session::SessionContext;

/// Starts serving gRPC on `listener` until the replica's servers stop.
pub(super) fn serve<H>(
    replica: &Replica,
    config: &Config,
    listener: TcpListener,
    tls: Option<tonic::transport::ServerTlsConfig>,
    auth: Arc<AuthPolicy>,
    sessions: SessionContext,
    health: H,
) -> Result<JoinHandle<Result<(), tonic::transport::Error>>, ServeError>
where
    H: Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    H::Future: Send + 'static,
{
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(herald_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            // google.rpc.BadRequest and the other error details: without them grpcurl prints
            // "google.rpc.BadRequest is not recognized" instead of the fields an error names.
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = builder()
        .build_v1()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    // Many grpcurl and IDE builds still ask the v1alpha reflection service only.
    let reflection_alpha = builder()
        .build_v1alpha()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let max = config.max_message_bytes as usize;
    let tasks = replica.tasks.clone();
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let router = builder
        // Dead executors are noticed by HTTP/2 pings, not only by lease expiry.
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        // Bounds unary handlers; a streaming response is returned at once, so the lease stream
        // itself is not cut by it.
        .timeout(Duration::from_secs(60))
        // Role, rate and namespace are checked before any handler runs.
        .layer(AuthLayer::shared(auth))
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(
            TaskServiceServer::new(TaskApi::new(tasks.clone())).max_decoding_message_size(max),
        )
        .add_service(
            TemplateServiceServer::new(TemplateApi::new(tasks.clone()))
                .max_decoding_message_size(max),
        )
        .add_service(
            SuppressionServiceServer::new(SuppressionApi::new(replica.store.clone()))
                .max_decoding_message_size(max),
        )
        .add_service(
            AccountServiceServer::new(AccountApi::new(replica.store.clone()))
                .max_decoding_message_size(max),
        )
        .add_service(
            ScheduleServiceServer::new(ScheduleApi::new(
                replica.schedules(config.min_schedule_period),
            ))
            .max_decoding_message_size(max),
        )
        .add_service(
            AudienceServiceServer::new(AudienceApi::new(Audiences::new(replica.store.clone())))
                .max_decoding_message_size(max),
        )
        .add_service(
            CampaignServiceServer::new(CampaignApi::new(Campaigns::new(tasks)))
                .max_decoding_message_size(max),
        )
        .add_service(
            LeaseServiceServer::new(LeaseApi::new(sessions)).max_decoding_message_size(max),
        )
        .add_service(
            StatsServiceServer::new(StatsApi::new(replica.store.clone()))
                .max_decoding_message_size(max),
        );
    let stop = replica.server_stop.clone();
    Ok(tokio::spawn(router.serve_with_incoming_shutdown(
        incoming(listener),
        async move { stop.cancelled().await },
    )))
}

/// The listener's connections, with TCP_NODELAY: lease and report frames are small and
/// latency-bound, and Nagle's algorithm held them back for tens of milliseconds (measured in
/// the benchmark's S3).
fn incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    TcpListenerStream::new(listener).map(|conn| {
        if let Ok(stream) = &conn {
            let _ = stream.set_nodelay(true);
        }
        conn
    })
}
