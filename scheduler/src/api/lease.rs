//! LeaseService: hands the stream to a lease session.

use herald_proto::v1::{lease_service_server::LeaseService, ExecutorMessage, SchedulerMessage};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::lease::session::{self, SessionContext};

/// The LeaseService implementation.
pub struct LeaseApi {
    ctx: SessionContext,
}

impl LeaseApi {
    /// Serves lease streams with the replica's shared session context.
    pub fn new(ctx: SessionContext) -> Self {
        LeaseApi { ctx }
    }
}

#[tonic::async_trait]
impl LeaseService for LeaseApi {
    type LeaseStream = ReceiverStream<Result<SchedulerMessage, Status>>;

    async fn lease(
        &self,
        request: Request<Streaming<ExecutorMessage>>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        let namespace = crate::auth::namespace_of(&request)?;
        let stream = session::open(self.ctx.clone(), namespace, request.into_inner()).await?;
        Ok(Response::new(stream))
    }
}
