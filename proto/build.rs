//! Generates Outpost's gRPC contracts from the `.proto` files beside this crate (`outpost/v1/`)
//! with protox, so no system `protoc` is needed.

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &[
    "outpost/v1/order.proto",
    "outpost/v1/order_service.proto",
    "outpost/v1/order_events.proto",
    "outpost/v1/admin_service.proto",
    "outpost/v1/consumer_admin_service.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=outpost");
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // Served by gRPC reflection so that grpcurl and similar tools need no local .proto files.
    fs::write(out_dir.join("outpost_descriptor.bin"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
