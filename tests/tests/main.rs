//! herald's end-to-end tests, one module per area, compiled as one test binary (see
//! `tests/Cargo.toml`): each runs the real scheduler and executor against a real PostgreSQL and
//! the providers' fakes. `cargo nextest run -p herald-tests -E 'test(/^faults::/)'` runs one
//! area.

mod account_slots;
mod accounts;
mod audiences;
mod bulk_operations;
mod campaigns;
mod console;
mod content;
mod dashboard;
mod duplicate_content;
mod end_reasons;
mod end_to_end;
mod executor_presence;
mod failover;
mod fanout;
mod faults;
mod fuzz_lease;
mod grant_claim;
mod harness_smoke;
mod history;
mod lease_protocol;
mod notifications;
mod pacing;
mod policies_and_edits;
mod schedule_overrun;
mod scheduler_health;
mod schedules;
mod security;
mod stack_smoke;
mod stats;
mod suppression;
mod tasks_api;
mod templates;
mod tracing;
mod whatsapp_callbacks;
mod whatsapp_stack;

/// A file or folder under `tests/tests/` that is not a module above is never compiled, so its
/// tests would silently never run: each must be named here.
#[test]
fn every_test_file_is_a_module_of_this_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let declared = include_str!("main.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("listing tests/tests") {
        let path = entry.expect("reading tests/tests").path();
        let module = if path.is_dir() {
            path.file_name()
        } else if path.extension().is_some_and(|e| e == "rs") {
            path.file_stem()
        } else {
            continue;
        };
        let module = module.and_then(|m| m.to_str()).unwrap_or_default();
        if module != "main" && !declared.contains(&format!("\nmod {module};\n")) {
            missing.push(module.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "not declared in tests/tests/main.rs: {missing:?}"
    );
}
