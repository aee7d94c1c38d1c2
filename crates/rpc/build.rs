//! Generates the control-plane code from proto/meta.proto with protox (pure Rust, no protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/meta.proto");
    let fds = protox::compile(["proto/meta.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
