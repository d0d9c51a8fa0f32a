//! Generates the Rust code for every `.proto` file under `proto/`.
//!
//! protoc comes from `protoc-bin-vendored`, a registry package that ships the binary, so a
//! fresh machine needs no system protoc. The protoc path is handed to prost-build through its
//! config rather than the `PROTOC` environment variable, which a build script cannot set for
//! itself without `unsafe`.

use std::path::PathBuf;

/// Every file compiled; add new services here.
const PROTOS: &[&str] = &[
    "proto/docket/v1/health.proto",
    "proto/docket/v1/raft.proto",
    "proto/docket/v1/jobs.proto",
    "proto/docket/v1/admin.proto",
    "proto/docket/v1/agents.proto",
    "proto/docket/v1/steps.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc: PathBuf = protoc_bin_vendored::protoc_bin_path()?;
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    // Protobuf `map` fields become BTreeMap: ordered, so anything that ends up in replicated
    // state or printed output iterates deterministically.
    config.btree_map(["."]);

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_with_config(config, PROTOS, &["proto"])?;
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
