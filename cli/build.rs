//! Links the `docket` command as a position-dependent executable.
//!
//! Every `sbatch`, `squeue` or `qsub` is a new process, and a site's scripts and portals
//! start thousands of them. A position-independent executable of this size carries about
//! 15,000 relative relocations: at every start the dynamic loader writes each of them,
//! copying every page of `.data.rel.ro` it touches (about 60 page faults), before `main`
//! runs. Linked at a fixed address the loader has nothing to relocate, and those pages are
//! shared with every other running command (measured on `sbatch -H`: about 35 fewer page
//! faults per start; the README's Benchmarks has the figures).
//!
//! What this gives up is the randomized address of the executable's own image (libraries,
//! stack and heap stay randomized). The command runs only with its user's own rights, is
//! never installed set-user-id, listens on no socket and talks only to controllers that
//! prove themselves with the cluster's certificate, so the input that could exploit a
//! memory error in it is its own user's. The daemons (controller, agent, authd), which
//! hold rights a user must not reach, stay position-independent.
fn main() {
    println!("cargo:rustc-link-arg-bin=docket=-no-pie");
    println!("cargo:rerun-if-changed=build.rs");
}
