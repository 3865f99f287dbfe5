//! Lists the numbered migrations of `migrations/` (`V<n>__<what_it_does>.sql`) for
//! `store/migrate.rs`, so adding a migration is adding its file.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut found: Vec<(u32, String, String)> = Vec::new();
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        let Some(stem) = file.strip_suffix(".sql") else {
            continue;
        };
        let Some((version, name)) = stem.strip_prefix('V').and_then(|s| s.split_once("__")) else {
            panic!("migration {file} is not named V<n>__<what_it_does>.sql");
        };
        let version: u32 = version
            .parse()
            .unwrap_or_else(|_| panic!("migration {file} has no version number"));
        // Each file as well as the folder: cargo's scan of a folder compares modification
        // times, which a renamed (renumbered) migration keeps, while a listed file that is
        // gone always reruns this script.
        println!("cargo:rerun-if-changed={}", path.display());
        found.push((version, name.to_owned(), path.display().to_string()));
    }
    found.sort();
    for (i, (version, name, _)) in found.iter().enumerate() {
        assert_eq!(
            *version as usize,
            i + 1,
            "migrations must be numbered 1, 2, 3, … without gaps; found V{version}__{name}"
        );
    }
    let mut out = String::from("&[\n");
    for (version, name, path) in &found {
        let _ = writeln!(
            out,
            "    Migration {{ version: {version}, name: {name:?}, sql: include_str!({path:?}) }},"
        );
    }
    out.push(']');
    let out_dir = std::env::var("OUT_DIR").unwrap_or_else(|e| panic!("OUT_DIR: {e}"));
    std::fs::write(Path::new(&out_dir).join("migrations.rs"), out)
        .unwrap_or_else(|e| panic!("writing the migration list: {e}"));
}
