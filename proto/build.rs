//! Compiles `herald/v1/*.proto` with protox (a pure-Rust protobuf compiler), so a fresh machine
//! builds with cargo alone and no system `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let files = [
        "herald/v1/task.proto",
        "herald/v1/lease.proto",
        "herald/v1/account.proto",
        "herald/v1/schedule.proto",
        "herald/v1/campaign.proto",
        "herald/v1/stats.proto",
        "herald/v1/template.proto",
        "herald/v1/suppression.proto",
        "herald/v1/audience.proto",
    ];
    println!("cargo:rerun-if-changed={}", root.join("herald").display());

    let descriptors = protox::compile(files, [&root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("herald_descriptor.bin");
    std::fs::write(
        &descriptor_path,
        prost::Message::encode_to_vec(&descriptors),
    )?;

    tonic_prost_build::configure()
        // BTreeMap makes encoding deterministic, which the idempotency check hashes.
        .btree_map(".")
        // A lease's content and fallback template are most of its size unboxed (776 bytes a
        // lease, 320 boxed): the executor's decoder grows its vector of 512 leases a batch by
        // copying less than half as much (docs/performance.md).
        .boxed(".herald.v1.Lease.content")
        .boxed(".herald.v1.Lease.window_closed_fallback")
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        .compile_fds(descriptors)?;
    Ok(())
}
