//! `sshare`: the fair-share tree. Accounts and users depth-first, each indented one space per
//! level, with raw and normalised shares, raw and effective usage and each user's factor
//! (`-l` adds Fair Tree's level fair-share). By default only your own associations and the
//! accounts above them, as Slurm does; `-a` for everyone; `-U` users' rows only.

use anyhow::Result;
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::{Client, rpc, runtime};

/// The fair-share tree.
#[derive(Debug, Clone, Parser)]
#[command(name = "sshare", version)]
pub struct SshareArgs {
    /// Every user, not only you.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Only these users.
    #[arg(short = 'u', long = "users", value_delimiter = ',')]
    pub users: Vec<String>,
    /// Only these accounts (and what is below them).
    #[arg(short = 'A', long = "accounts", value_delimiter = ',')]
    pub accounts: Vec<String>,
    /// Long form: LevelFS too.
    #[arg(short = 'l', long)]
    pub long: bool,
    /// Only users' rows, not the accounts' (what workflow managers read a user's accounts
    /// from: `sshare -U -u USER -n -P`).
    #[arg(short = 'U', long = "Users")]
    pub users_only: bool,
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    /// `|`-separated, with a trailing `|` (`-P`: without).
    #[arg(short = 'p', long = "parsable")]
    pub parsable: bool,
    #[arg(short = 'P', long = "parsable2")]
    pub parsable2: bool,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub addr: Option<String>,
}

fn number(x: f64) -> String {
    if x.is_infinite() {
        "inf".into()
    } else if x.is_nan() {
        String::new()
    } else {
        format!("{x:.6}")
    }
}

/// The cells of one row.
fn cells(r: &pb::ShareRow, long: bool, indent: bool) -> Vec<String> {
    let pad = if indent {
        " ".repeat(r.depth.saturating_sub(1) as usize)
    } else {
        String::new()
    };
    let mut out = vec![
        format!("{pad}{}", r.account),
        r.user.clone(),
        r.raw_shares.to_string(),
        number(r.norm_shares),
        format!("{:.0}", r.raw_usage),
        number(r.effective_usage),
    ];
    if long {
        out.push(number(r.level_fs));
    }
    out.push(r.fairshare.map(number).unwrap_or_default());
    out
}

/// The table as sshare prints it.
pub fn table(
    r: &pb::ShareTreeResponse,
    long: bool,
    header: bool,
    parsable: Option<&str>,
) -> String {
    let mut names = vec![
        "Account",
        "User",
        "RawShares",
        "NormShares",
        "RawUsage",
        "EffectvUsage",
    ];
    let mut widths = vec![20usize, 10, 10, 11, 11, 13];
    if long {
        names.push("LevelFS");
        widths.push(10);
    }
    names.push("FairShare");
    widths.push(10);
    let mut out = String::new();
    if let Some(end) = parsable {
        if header {
            out.push_str(&format!("{}{end}\n", names.join("|")));
        }
        for row in &r.rows {
            out.push_str(&format!("{}{end}\n", cells(row, long, false).join("|")));
        }
        return out;
    }
    let line = |cells: &[String]| -> String {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, &w))| {
                let c: String = c.chars().take(w).collect();
                if i < 2 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
            .trim_end()
            .to_owned()
    };
    if header {
        let h: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        out.push_str(&line(&h));
        out.push('\n');
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        out.push_str(&rule.join(" "));
        out.push('\n');
    }
    for row in &r.rows {
        out.push_str(&line(&cells(row, long, true)));
        out.push('\n');
    }
    out
}

pub fn sshare(a: SshareArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let users = if a.all || !a.users.is_empty() || !a.accounts.is_empty() {
        a.users.clone()
    } else {
        vec![client.user()?.to_owned()]
    };
    let mut r = runtime()?.block_on(rpc!(
        client,
        jobs_read,
        share_tree,
        pb::ShareTreeRequest {
            users: users.clone(),
            accounts: a.accounts.clone(),
        }
    ))?;
    if a.users_only {
        r.rows.retain(|row| !row.user.is_empty());
    }
    if a.json {
        let rows: Vec<_> = r
            .rows
            .iter()
            .map(|x| {
                serde_json::json!({"account": x.account, "user": x.user, "depth": x.depth,
                "raw_shares": x.raw_shares, "norm_shares": x.norm_shares,
                "raw_usage": x.raw_usage, "effective_usage": x.effective_usage,
                "level_fs": if x.level_fs.is_finite() { Some(x.level_fs) } else { None },
                "fairshare": x.fairshare})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"algorithm": r.algorithm, "shares": rows})
        );
        return Ok(());
    }
    let parsable = if a.parsable {
        Some("|")
    } else if a.parsable2 {
        Some("")
    } else {
        None
    };
    print!("{}", table(&r, a.long, !a.noheader, parsable));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_indents_by_depth() {
        let row = |account: &str, user: &str, depth, usage, fs| pb::ShareRow {
            account: account.into(),
            user: user.into(),
            depth,
            raw_shares: 1,
            norm_shares: 0.5,
            raw_usage: usage,
            effective_usage: 0.25,
            level_fs: 2.0,
            fairshare: fs,
        };
        let r = pb::ShareTreeResponse {
            algorithm: "fair_tree".into(),
            rows: vec![
                row("scc", "", 1, 100.0, None),
                row("scc", "dave", 2, 0.0, Some(1.0)),
            ],
        };
        let text = table(&r, false, true, None);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "Account              User        RawShares  NormShares    RawUsage  EffectvUsage  FairShare"
        );
        assert_eq!(
            lines[2],
            "scc                                      1    0.500000         100      0.250000"
        );
        assert_eq!(
            lines[3],
            " scc                 dave                1    0.500000           0      0.250000   1.000000"
        );
        let p = table(&r, true, false, Some("|"));
        assert_eq!(
            p.lines().nth(1),
            Some("scc|dave|1|0.500000|0|0.250000|2.000000|1.000000|")
        );
    }
}
