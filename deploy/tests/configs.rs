//! Every example configuration in deploy/config/ (the seed sites: HPC2N's Maui policies,
//! NCI's queues and charges, GWDG's Slurm weights and Fair Tree, IT4I's formula) and the
//! launcher's generated site pass `docket-controller check-config`; a broken one fails with
//! the key named. (controller/core/tests/site.rs checks what each one means against the
//! seeds.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn controller() -> PathBuf {
    docket_deploy::testing::bin_dir(env!("CARGO_BIN_EXE_docket-local"), &["docket-controller"])
        .join("docket-controller")
}

fn check(bin: &Path, file: &Path) -> Output {
    Command::new(bin)
        .arg("check-config")
        .arg(file)
        .output()
        .unwrap()
}

#[test]
fn every_example_configuration_passes_check_config() {
    let bin = controller();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let o = check(&bin, &path);
            assert!(o.status.success(), "{}: {o:?}", path.display());
            assert!(
                String::from_utf8_lossy(&o.stdout).contains(": valid ("),
                "{o:?}"
            );
            seen.push(path.file_stem().unwrap().to_string_lossy().into_owned());
        }
    }
    seen.sort();
    assert_eq!(seen, ["gwdg", "hpc2n", "it4i", "nci"]);

    let tmp = tempfile::tempdir().unwrap();
    let layout = docket_deploy::Layout::new(3, 4, 2, tmp.path().into(), tmp.path().into());
    let generated = tmp.path().join("local.toml");
    std::fs::write(&generated, layout.site_toml()).unwrap();
    let o = check(&bin, &generated);
    assert!(o.status.success(), "{o:?}");

    let broken = tmp.path().join("broken.toml");
    std::fs::write(
        &broken,
        "[[partitions]]\nPartitionName = \"x\"\nNodes = \"ALL\"\nMaxTime = \"5 days\"\n",
    )
    .unwrap();
    let o = check(&bin, &broken);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("MaxTime"), "{err}");
}
