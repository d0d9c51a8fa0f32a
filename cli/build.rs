//! Links the `docket` command as a position-dependent executable on Linux with glibc.
//!
//! Every `sbatch`, `squeue` or `qsub` is a new process, and a site's scripts and portals
//! start thousands of them. A position-independent executable of this size carries about
//! 15,000 relative relocations: at every start the dynamic loader writes each of them,
//! copying every page of `.data.rel.ro` it touches, before `main` runs. Linked at a fixed
//! address the loader has nothing to relocate, and those pages stay shared with every other
//! running command (measured on `sbatch -H`: about 35 fewer page faults per start; the
//! README's Benchmarks has the figures).
//!
//! What this gives up is the randomized address of the executable's own image (libraries,
//! stack and heap stay randomized), a defence in depth against memory errors. The command
//! runs only with the rights of whoever starts it, is never installed set-user-id, listens on
//! no socket, and talks only to controllers and node agents that prove themselves with the
//! cluster CA's certificates (and to the local credential signer). What it parses from
//! them — other users' job names and comments included, which an administrator running
//! `squeue` as root also sees — goes through safe Rust (prost, h2, rustls). The daemons
//! (controller, agent, authd), which hold rights a user must not reach, stay
//! position-independent.
//!
//! Only on Linux with glibc: with musl `-no-pie` would cancel rustc's `-static-pie`, and other
//! systems' linkers do not take it.
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bin=docket=-no-pie");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
