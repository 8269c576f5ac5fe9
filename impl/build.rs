//! Generates the engine and plugin families' gRPC code from `proto/` (engine-protocol.md,
//! "Compatibility": the committed schemas are the single definition). The schemas are
//! compiled by `protox` (no system `protoc`), the Rust code by tonic/prost, and the
//! descriptor set of every file is kept for dynamic messages
//! (`contract_impl::engine::DESCRIPTOR_SET`, shared by both families).

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "common/v1/common.proto",
    "engine/v1/engine.proto",
    "engine/v1/events.proto",
    "engine/v1/snapshot.proto",
    "plugin/v1/plugin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `impl/proto` links to the repository's `proto/` (a packaged crate carries a copy).
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let files = protox::compile(PROTOS, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("engine_descriptor.bin"),
        prost::Message::encode_to_vec(&files),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(files)?;
    Ok(())
}
