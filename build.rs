//! Generates Idempost's gRPC contracts from `proto/idempost/v1/*.proto` with protox, so no system
//! `protoc` is needed. It is the build script of the `idempost-proto` package (`proto/`), whose
//! directory is the working directory here, and whose `src/lib.rs` includes what it writes.

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &[
    "idempost/v1/order.proto",
    "idempost/v1/order_service.proto",
    "idempost/v1/order_events.proto",
    "idempost/v1/admin_service.proto",
    "idempost/v1/consumer_admin_service.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=idempost");
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // Served by gRPC reflection so that grpcurl and similar tools need no local .proto files.
    fs::write(out_dir.join("idempost_descriptor.bin"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
