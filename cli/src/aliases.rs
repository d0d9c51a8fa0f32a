//! `docket install-aliases DIR`: the Slurm and PBS names as symlinks to this binary, which
//! speaks each one's dialect when invoked under it.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
/// Every name `docket` answers to.
pub const ALIASES: [&str; 18] = [
    "sbatch", "srun", "salloc", "squeue", "scancel", "sinfo", "scontrol", "sprio", "sshare",
    "sacct", "sacctmgr", "qsub", "qstat", "qdel", "qhold", "qrls", "pbsnodes", "pbsdsh",
];

/// `docket install-aliases DIR`: symlinks DIR/sbatch, ... to this binary.
pub fn install_aliases(dir: &PathBuf) -> Result<()> {
    let me = std::env::current_exe().context("locating this binary")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Beside the binary, the links name it relatively: the directory can move.
    let same_dir = me.parent().and_then(|p| p.canonicalize().ok()) == dir.canonicalize().ok();
    let target = match me.file_name() {
        Some(name) if same_dir => PathBuf::from(name),
        _ => me.clone(),
    };
    for name in ALIASES {
        let link = dir.join(name);
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&link)?,
            Ok(_) => bail!(
                "{} exists and is not a symlink; not replacing it",
                link.display()
            ),
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&target, &link)
            .with_context(|| format!("linking {}", link.display()))?;
        println!("{} -> {}", link.display(), target.display());
    }
    Ok(())
}
