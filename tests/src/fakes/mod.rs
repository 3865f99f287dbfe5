//! Local fakes of the providers the executor's senders talk to. Each is an axum server on
//! `127.0.0.1:0` that speaks the provider's documented JSON (providers.md), checks the
//! credentials and the request body like the real API, records every request, and can be told
//! to answer any error row of the provider's classification table.

pub mod media;
pub mod wecom;
pub mod wecom_media;
pub mod whatsapp;
pub mod whatsapp_content;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex, recovering the data if a panicking test poisoned it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
