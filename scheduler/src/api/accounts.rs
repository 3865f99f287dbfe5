//! AccountService: sending accounts and pools.

use herald_proto::v1::{self as pb, account_service_server::AccountService};
use tonic::{Request, Response, Status};

use super::convert::{self, accounts as wire};
use crate::accounts::model::AccountState;
use crate::auth::namespace_of;
use crate::error::Error;
use crate::rules;
use crate::store::transaction;
use crate::store::{Db, Store};

/// The AccountService implementation.
pub struct AccountApi {
    store: Store,
}

impl AccountApi {
    /// Serves accounts from `store`.
    pub fn new(store: Store) -> Self {
        AccountApi { store }
    }
}

/// A pool's description, checked.
fn description(field: &str, pool: &pb::Pool) -> Result<(), Error> {
    if pool.description.chars().count() > 1024 {
        return Err(Error::invalid(field, "must be at most 1024 characters"));
    }
    match rules::text_problem(&pool.description) {
        Some(problem) => Err(Error::invalid(field, problem)),
        None => Ok(()),
    }
}

#[tonic::async_trait]
impl AccountService for AccountApi {
    async fn create_account(
        &self,
        request: Request<pb::CreateAccountRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let ns = namespace_of(&request)?;
        let Some(account) = request.into_inner().account else {
            return Err(Error::invalid("account", "is required").into());
        };
        let spec = wire::checked_account(&account)?;
        let record = transaction!(self.store, Error, |tx| Ok::<_, Error>(
            tx.accounts().create(&ns, &spec).await?
        ))?;
        tracing::info!(account = %spec.id, pool = %spec.pool, "account created");
        Ok(Response::new(wire::account(&record)))
    }

    async fn update_account(
        &self,
        request: Request<pb::UpdateAccountRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let Some(patch) = req.account else {
            return Err(Error::invalid("account", "is required").into());
        };
        let paths = req.update_mask.map(|m| m.paths).unwrap_or_default();
        if paths.is_empty() {
            return Err(Error::invalid("update_mask", "name at least one field to change").into());
        }
        rules::name("account.id", &patch.id)?;
        let record = transaction!(self.store, Error, |tx| {
            // Read under the row's lock: a pause or an offline spell written by a report or a
            // webhook meanwhile is kept, not overwritten with the state read before it.
            let locked = tx.accounts().lock(&ns, &patch.id).await?;
            let current = match tx.accounts().get(&ns, &patch.id).await? {
                Some(current) if locked => current,
                _ => return Err(Error::NotFound(format!("account {}", patch.id))),
            };
            let mut merged = wire::account(&current);
            // An offline account keeps that state unless the mask sets the state.
            let keeps_offline =
                current.spec.state == AccountState::Offline && !paths.iter().any(|p| p == "state");
            if keeps_offline {
                merged.state = pb::AccountState::Active as i32;
            }
            wire::merge(&mut merged, &patch, &paths)?;
            let mut spec = wire::checked_account(&merged)?;
            if keeps_offline {
                spec.state = AccountState::Offline;
            }
            Ok(tx.accounts().update(&ns, &spec).await?)
        })?;
        Ok(Response::new(wire::account(&record)))
    }

    async fn get_account(
        &self,
        request: Request<pb::GetAccountRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let ns = namespace_of(&request)?;
        let id = request.into_inner().id;
        rules::name("id", &id)?;
        let record = self
            .store
            .conn()
            .await
            .map_err(Error::from)?
            .accounts()
            .get(&ns, &id)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("account {id}")))?;
        Ok(Response::new(wire::account(&record)))
    }

    async fn list_accounts(
        &self,
        request: Request<pb::ListAccountsRequest>,
    ) -> Result<Response<pb::ListAccountsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let limit = rules::page_size("page_size", req.page_size, 100)?;
        let after = convert::page_after_name(&req.page_token, "ListAccounts")?;
        let pool = (!req.pool.is_empty()).then_some(req.pool.as_str());
        let records = self
            .store
            .conn()
            .await
            .map_err(Error::from)?
            .accounts()
            .list(&ns, pool, after.as_deref(), limit + 1)
            .await
            .map_err(Error::from)?;
        let (records, next_page_token) = crate::store::sql::page(records, limit, |last| {
            convert::page_token(last.spec.id.as_bytes())
        });
        Ok(Response::new(pb::ListAccountsResponse {
            accounts: records.iter().map(wire::account).collect(),
            next_page_token,
        }))
    }

    async fn delete_account(
        &self,
        request: Request<pb::DeleteAccountRequest>,
    ) -> Result<Response<pb::DeleteAccountResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = request.into_inner().id;
        rules::name("id", &id)?;
        transaction!(self.store, Error, |tx| {
            // Counted under the row's lock, by a statement begun after it: a claim reserving
            // on the account holds the row until it commits, so the leases it made are seen
            // (counted from a snapshot taken before the wait, they were not, and the account
            // went with its leases out).
            tx.accounts().lock(&ns, &id).await?;
            tx.accounts().delete(&ns, &id).await.map_err(Error::from)
        })?;
        Ok(Response::new(pb::DeleteAccountResponse {}))
    }

    async fn record_inbound(
        &self,
        request: Request<pb::RecordInboundRequest>,
    ) -> Result<Response<pb::RecordInboundResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        rules::name("account_id", &req.account_id)?;
        if req.recipient.is_empty() || req.recipient.len() > 256 {
            return Err(Error::invalid("recipient", "must be 1 to 256 bytes").into());
        }
        if let Some(problem) = rules::text_problem(&req.recipient) {
            return Err(Error::invalid("recipient", problem).into());
        }
        let at = match &req.received_at {
            None => None,
            Some(t) => Some(
                convert::from_timestamp(t)
                    .ok_or_else(|| Error::invalid("received_at", "is not a valid timestamp"))?,
            ),
        };
        let conn = self.store.conn().await.map_err(Error::from)?;
        let until = conn
            .accounts()
            .record_inbound(&ns, &req.account_id, &req.recipient, at)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("account {}", req.account_id)))?;
        Ok(Response::new(pb::RecordInboundResponse {
            window_until: Some(convert::timestamp(until)),
        }))
    }

    async fn record_provider_standing(
        &self,
        request: Request<pb::RecordProviderStandingRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        rules::name("account_id", &req.account_id)?;
        let quality = match req.quality.to_ascii_lowercase().as_str() {
            "" => None,
            q @ ("green" | "yellow" | "red" | "unknown") => Some(q.to_owned()),
            _ => {
                return Err(
                    Error::invalid("quality", "must be green, yellow, red or unknown").into(),
                )
            }
        };
        let mut v = crate::error::Violations::default();
        let tier = (req.tier != pb::MessagingTier::Unspecified as i32)
            .then(|| wire::tier_limit(req.tier, "tier", &mut v));
        if !v.is_empty() {
            return Err(v.into_error().into());
        }
        let conn = self.store.conn().await.map_err(Error::from)?;
        let accounts = conn.accounts();
        let found = accounts
            .record_standing(&ns, &req.account_id, quality.as_deref(), tier)
            .await
            .map_err(Error::from)?;
        let record = match found {
            true => accounts
                .get(&ns, &req.account_id)
                .await
                .map_err(Error::from)?,
            false => None,
        }
        .ok_or_else(|| Error::NotFound(format!("account {}", req.account_id)))?;
        Ok(Response::new(wire::account(&record)))
    }

    async fn create_pool(
        &self,
        request: Request<pb::CreatePoolRequest>,
    ) -> Result<Response<pb::Pool>, Status> {
        let ns = namespace_of(&request)?;
        let Some(pool) = request.into_inner().pool else {
            return Err(Error::invalid("pool", "is required").into());
        };
        rules::name("pool.name", &pool.name)?;
        description("pool.description", &pool)?;
        let conn = self.store.conn().await.map_err(Error::from)?;
        let record = conn
            .accounts()
            .create_pool(&ns, &pool.name, &pool.description, pool.sticky)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(wire::pool(&record)))
    }

    async fn update_pool(
        &self,
        request: Request<pb::UpdatePoolRequest>,
    ) -> Result<Response<pb::Pool>, Status> {
        let ns = namespace_of(&request)?;
        let Some(pool) = request.into_inner().pool else {
            return Err(Error::invalid("pool", "is required").into());
        };
        rules::name("pool.name", &pool.name)?;
        description("pool.description", &pool)?;
        let conn = self.store.conn().await.map_err(Error::from)?;
        let record = conn
            .accounts()
            .update_pool(&ns, &pool.name, &pool.description, pool.sticky)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(wire::pool(&record)))
    }

    async fn get_pool(
        &self,
        request: Request<pb::GetPoolRequest>,
    ) -> Result<Response<pb::Pool>, Status> {
        let ns = namespace_of(&request)?;
        let name = request.into_inner().name;
        rules::name("name", &name)?;
        let conn = self.store.conn().await.map_err(Error::from)?;
        let record = conn
            .accounts()
            .get_pool(&ns, &name)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("pool {name}")))?;
        Ok(Response::new(wire::pool(&record)))
    }

    async fn list_pools(
        &self,
        request: Request<pb::ListPoolsRequest>,
    ) -> Result<Response<pb::ListPoolsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let conn = self.store.conn().await.map_err(Error::from)?;
        let pools = conn
            .accounts()
            .list_pools(&ns, None)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListPoolsResponse {
            pools: pools.iter().map(wire::pool).collect(),
        }))
    }

    async fn delete_pool(
        &self,
        request: Request<pb::DeletePoolRequest>,
    ) -> Result<Response<pb::DeletePoolResponse>, Status> {
        let ns = namespace_of(&request)?;
        let name = request.into_inner().name;
        rules::name("name", &name)?;
        let conn = self.store.conn().await.map_err(Error::from)?;
        conn.accounts()
            .delete_pool(&ns, &name)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::DeletePoolResponse {}))
    }
}
