//! Links the `docket` command for a quick start on Linux with glibc: at a fixed address, and
//! with gcc's unwinder inside it rather than loaded from `libgcc_s.so.1`.
//!
//! Every `sbatch`, `squeue` or `qsub` is a new process, and a site's scripts and portals
//! start thousands of them.
//!
//! **A fixed address.** A position-independent executable of this size carries about
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
//! **The unwinder linked in** (what gcc's `-static-libgcc` does for a C++ program, and what
//! rustc does itself for a static glibc target). Rust's standard library unwinds panics and
//! walks backtraces with libgcc's `_Unwind_*`, which it takes from `libgcc_s.so.1`: one more
//! library for the loader to map, relocate and bind at every start, whose constructor then
//! probes the CPU (`__cpu_indicator_init`: `cpuid`, which traps to the hypervisor in a
//! virtual machine). The command links the whole of `libgcc_eh.a` instead, the same unwinder
//! as an archive, ahead of the standard library's `-lgcc_s`: every `_Unwind_*` symbol is then
//! defined in the executable, so one unwinder serves every frame, and the linker (rustc asks
//! for `--as-needed`) records no need of `libgcc_s.so.1`. Measured (`perf stat -r 300
//! sbatch --version`, three runs each): 0.72–0.74 ms of cpu and 118–119 page faults per start
//! with the library, 0.62–0.63 ms and 110–112 without. `tests/linking.rs` checks that the
//! library stays out and that a panic still unwinds and reports.
//!
//! What this gives up: the unwinder is the build host's gcc's, fixed in the command (an
//! update of the host's `libgcc_s` no longer reaches it), and it needs what that gcc's
//! unwinder needs of glibc: built with gcc 12 on Debian 12, `_dl_find_object`, so glibc 2.35
//! or later where the command runs (the daemons need 2.34). Build on the oldest system the
//! command must run on, as for any glibc program.
//!
//! Only on Linux with glibc: with musl `-no-pie` would cancel rustc's `-static-pie`, and other
//! systems' linkers do not take it.
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bin=docket=-no-pie");
        // Whole: every member, so that no `_Unwind_*` is left for `libgcc_s` to define.
        println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=gcc_eh");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
