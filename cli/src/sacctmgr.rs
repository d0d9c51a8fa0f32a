//! `sacctmgr show|list ENTITY [where] [SPEC...] [format=F,...]`: Slurm's view of the
//! accounting database — users, accounts, associations, QOS, the cluster — read-only, in
//! Slurm's columns and formats (`-n`, `-p`, `-P`, `Name%W`). Workflow managers and portals
//! check a user's accounts this way before they submit (`sacctmgr -n -P show assoc
//! where user=$USER format=account`). `delete user|account|qos NAME` removes whole objects,
//! as `docket config remove` does (administrators only, unused objects only); accounts and
//! users are added and changed in the site's docket.toml with `docket config apply`, which
//! `add` and `modify` say.

use anyhow::{Result, anyhow, bail};
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::{Client, rpc, runtime};

/// Slurm's sacctmgr, read-only.
#[derive(Debug, Clone, Parser)]
#[command(name = "sacctmgr", version)]
pub struct SacctmgrArgs {
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    /// `|`-separated, with a trailing `|` (`-P`: without).
    #[arg(short = 'p', long = "parsable")]
    pub parsable: bool,
    #[arg(short = 'P', long = "parsable2")]
    pub parsable2: bool,
    /// Users and accounts with their associations.
    #[arg(short = 's', long = "associations")]
    pub with_assoc: bool,
    /// Accepted (nothing is ever asked).
    #[arg(short = 'i', long = "immediate")]
    pub immediate: bool,
    #[arg(short = 'Q', long = "quiet")]
    pub quiet: bool,
    #[arg(long)]
    pub addr: Option<String>,
    // The text is `--help`'s, where brackets mean optional, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// show|list ENTITY [where] [SPEC...] [format=...]
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub words: Vec<String>,
}

/// What is listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entity {
    User,
    Account,
    Assoc,
    Qos,
    Cluster,
}

impl Entity {
    fn parse(word: &str) -> Result<Entity> {
        Ok(match word.to_ascii_lowercase().as_str() {
            "user" | "users" => Entity::User,
            "account" | "accounts" => Entity::Account,
            "association" | "associations" | "assoc" | "assocs" => Entity::Assoc,
            "qos" => Entity::Qos,
            "cluster" | "clusters" => Entity::Cluster,
            other => bail!("unknown entity {other:?}: user, account, association, qos or cluster"),
        })
    }

    /// Slurm's default columns.
    fn default_format(self, with_assoc: bool) -> &'static str {
        match (self, with_assoc) {
            (Entity::User, false) => "User,DefaultAccount,AdminLevel",
            (Entity::User, true) => {
                "User,DefaultAccount,AdminLevel,Cluster,Account,Partition,Share,Priority,\
                 MaxJobs,MaxNodes,MaxCPUs,MaxSubmit,MaxWall,MaxCPUMins,QOS,DefaultQOS"
            }
            (Entity::Account, false) => "Account,Description,Organization",
            (Entity::Account, true) => {
                "Account,Description,Organization,Cluster,ParentName,User,Share,Priority,\
                 GrpJobs,GrpNodes,GrpCPUs,GrpMem,GrpSubmit,GrpWall,GrpCPUMins,MaxJobs,\
                 MaxNodes,MaxCPUs,MaxSubmit,MaxWall,MaxCPUMins,QOS,DefaultQOS"
            }
            (Entity::Assoc, _) => {
                "Cluster,Account,User,Partition,Share,Priority,GrpJobs,GrpTRES,GrpSubmit,\
                 GrpWall,GrpTRESMins,MaxJobs,MaxTRES,MaxTRESPerNode,MaxSubmit,MaxWall,\
                 MaxTRESMins,QOS,DefaultQOS,GrpTRESRunMins"
            }
            (Entity::Qos, _) => {
                "Name,Priority,GraceTime,Preempt,PreemptExemptTime,PreemptMode,Flags,\
                 UsageThres,UsageFactor,GrpTRES,GrpTRESMins,GrpTRESRunMins,GrpJobs,GrpSubmit,\
                 GrpWall,MaxTRES,MaxTRESPerNode,MaxTRESMins,MaxWall,MaxTRESPU,MaxJobsPU,\
                 MaxSubmitPU,MaxTRESPA,MaxJobsPA,MaxSubmitPA,MinTRES"
            }
            (Entity::Cluster, _) => {
                "Cluster,ControlHost,ControlPort,RPC,Share,GrpJobs,GrpTRES,GrpSubmit,MaxJobs,\
                 MaxTRES,MaxSubmit,MaxWall,QOS,DefaultQOS"
            }
        }
    }
}

/// Every field: its name, the header Slurm prints, the default width.
const FIELDS: &[(&str, &str, usize)] = &[
    ("Account", "Account", 10),
    ("AdminLevel", "Admin", 9),
    ("Cluster", "Cluster", 10),
    ("ControlHost", "ControlHost", 15),
    ("ControlPort", "ControlPort", 12),
    ("Coordinators", "Coord Accounts", 20),
    ("DefaultAccount", "Def Acct", 10),
    ("DefaultQOS", "Def QOS", 9),
    ("Description", "Descr", 20),
    ("Flags", "Flags", 10),
    ("GraceTime", "GraceTime", 10),
    ("GrpCPUMins", "GrpCPUMins", 11),
    ("GrpCPUs", "GrpCPUs", 8),
    ("GrpJobs", "GrpJobs", 7),
    ("GrpMem", "GrpMem", 7),
    ("GrpNodes", "GrpNodes", 8),
    ("GrpSubmit", "GrpSubmit", 9),
    ("GrpTRES", "GrpTRES", 13),
    ("GrpTRESMins", "GrpTRESMins", 13),
    ("GrpTRESRunMins", "GrpTRESRunMin", 13),
    ("GrpWall", "GrpWall", 11),
    ("MaxCPUMins", "MaxCPUMins", 11),
    ("MaxCPUs", "MaxCPUs", 8),
    ("MaxJobs", "MaxJobs", 7),
    ("MaxJobsPA", "MaxJobsPA", 9),
    ("MaxJobsPU", "MaxJobsPU", 9),
    ("MaxNodes", "MaxNodes", 8),
    ("MaxSubmit", "MaxSubmit", 9),
    ("MaxSubmitPA", "MaxSubmitPA", 11),
    ("MaxSubmitPU", "MaxSubmitPU", 11),
    ("MaxTRES", "MaxTRES", 13),
    ("MaxTRESMins", "MaxTRESMins", 13),
    ("MaxTRESPA", "MaxTRESPA", 13),
    ("MaxTRESPerNode", "MaxTRESPerNode", 14),
    ("MaxTRESPU", "MaxTRESPU", 13),
    ("MaxWall", "MaxWall", 11),
    ("MinTRES", "MinTRES", 13),
    ("Name", "Name", 10),
    ("Organization", "Org", 20),
    ("ParentName", "Par Name", 10),
    ("Partition", "Partition", 10),
    ("Preempt", "Preempt", 10),
    ("PreemptExemptTime", "PreemptExemptTime", 19),
    ("PreemptMode", "PreemptMode", 11),
    ("Priority", "Priority", 10),
    ("QOS", "QOS", 20),
    ("RPC", "RPC", 5),
    ("Share", "Share", 9),
    ("UsageFactor", "UsageFactor", 11),
    ("UsageThres", "UsageThres", 10),
    ("User", "User", 10),
];

/// Other names Slurm accepts for a field in `format=`.
fn canonical(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    let alias = match lower.as_str() {
        "defaultaccount" | "defacct" | "def acct" => "DefaultAccount",
        "admin" => "AdminLevel",
        "descr" => "Description",
        "org" => "Organization",
        "parent" | "parentname" | "par name" => "ParentName",
        "fairshare" | "shares" => "Share",
        "defaultqos" | "defqos" | "def qos" => "DefaultQOS",
        "coord" | "coordinator" | "coordinators" => "Coordinators",
        "users" => "User",
        "accounts" => "Account",
        "clusters" => "Cluster",
        "partitions" => "Partition",
        other => other,
    };
    FIELDS
        .iter()
        .find(|(f, _, _)| f.eq_ignore_ascii_case(alias))
        .map(|(f, _, _)| *f)
}

/// The widest column `Name%W` may ask for (as sacct's and squeue's formats).
const MAX_WIDTH: usize = 1024;

/// A chosen column: its field and width.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    field: &'static str,
    width: usize,
}

fn columns(format: &str) -> Result<Vec<Column>> {
    format
        .split(',')
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let (name, width) = match f.trim().split_once('%') {
                Some((n, w)) => (
                    n,
                    Some(
                        w.parse::<usize>()
                            .ok()
                            .filter(|w| *w <= MAX_WIDTH)
                            .ok_or_else(|| {
                                anyhow!(
                                    "format: {f:?}: the width after % must be a number up to {MAX_WIDTH}"
                                )
                            })?,
                    ),
                ),
                None => (f.trim(), None),
            };
            let field =
                canonical(name).ok_or_else(|| anyhow!("format: {name:?} is not a field"))?;
            let default = FIELDS
                .iter()
                .find(|(n, _, _)| *n == field)
                .map_or(10, |(_, _, w)| *w);
            Ok(Column {
                field,
                width: width.unwrap_or(default),
            })
        })
        .collect()
}

/// `key=value` filters and the format, from the words after the entity.
#[derive(Debug, Default, PartialEq, Eq)]
struct Specs {
    names: Vec<String>,
    users: Vec<String>,
    accounts: Vec<String>,
    clusters: Vec<String>,
    parents: Vec<String>,
    format: Option<String>,
    with_assoc: bool,
}

fn specs(words: &[String]) -> Result<Specs> {
    let mut s = Specs::default();
    let list = |v: &str| -> Vec<String> {
        v.split(',')
            .filter(|x| !x.is_empty())
            .map(str::to_owned)
            .collect()
    };
    for w in words {
        let lower = w.to_ascii_lowercase();
        if lower == "where" || lower == "set" {
            continue;
        }
        if lower == "withassoc" || lower == "withassocs" {
            s.with_assoc = true;
            continue;
        }
        let Some((key, value)) = w.split_once('=') else {
            s.names.extend(list(w));
            continue;
        };
        match key.to_ascii_lowercase().as_str() {
            "name" | "names" => s.names.extend(list(value)),
            "user" | "users" => s.users.extend(list(value)),
            "account" | "accounts" | "acct" => s.accounts.extend(list(value)),
            "cluster" | "clusters" => s.clusters.extend(list(value)),
            "parent" | "parentname" => s.parents.extend(list(value)),
            "format" => s.format = Some(value.to_owned()),
            other => bail!(
                "{other:?} is not a filter here: name, user, account, cluster, parent, format"
            ),
        }
    }
    Ok(s)
}

fn matches(filter: &[String], value: &str) -> bool {
    filter.is_empty() || filter.iter().any(|f| f == value)
}

/// One printed row: a field's value by name.
type Row = Vec<(&'static str, String)>;

fn limit<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

fn admin_level(admin: bool) -> &'static str {
    if admin { "Administrator" } else { "None" }
}

/// `D-HH:MM:SS` as Slurm prints a wall limit, or `MM:SS`/`HH:MM:SS` when shorter.
fn wall(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h:02}:{m:02}:{s:02}")
    } else {
        format!("{m:02}:{s:02}")
    }
}

/// Slurm prints a usage factor with six decimals.
fn factor(f: f64) -> String {
    format!("{f:.6}")
}

fn assoc_row(r: &pb::AssociationsResponse, a: &pb::AssocEntry, qos: &str) -> Row {
    vec![
        ("Cluster", r.cluster.clone()),
        ("Account", a.account.clone()),
        ("User", a.user.clone()),
        ("Partition", String::new()),
        (
            "ParentName",
            if a.user.is_empty() {
                a.parent.clone()
            } else {
                String::new()
            },
        ),
        ("Share", a.shares.to_string()),
        (
            "Priority",
            if a.priority > 0 {
                a.priority.to_string()
            } else {
                String::new()
            },
        ),
        ("MaxJobs", limit(a.max_jobs)),
        (
            "GrpTRESRunMins",
            limit(a.grp_cpu_run_mins.map(|m| format!("cpu={m}"))),
        ),
        ("GrpCPUMins", String::new()),
        ("QOS", qos.to_owned()),
        ("DefaultQOS", r.default_qos.clone()),
    ]
}

/// The rows of `entity`, filtered.
fn rows(r: &pb::AssociationsResponse, entity: Entity, s: &Specs, with_assoc: bool) -> Vec<Row> {
    let qos_names: Vec<&str> = r.qos.iter().map(|q| q.name.as_str()).collect();
    let qos = qos_names.join(",");
    match entity {
        Entity::User => user_rows(r, s, with_assoc, &qos),
        Entity::Account => account_rows(r, s, with_assoc, &qos),
        Entity::Assoc => r
            .assocs
            .iter()
            .filter(|a| {
                matches(&s.accounts, &a.account)
                    && (s.users.is_empty() || matches(&s.users, &a.user))
                    && (s.names.is_empty() || matches(&s.names, &a.account))
                    && matches(&s.clusters, &r.cluster)
                    && matches(&s.parents, &a.parent)
            })
            .map(|a| assoc_row(r, a, &qos))
            .collect(),
        Entity::Qos => r
            .qos
            .iter()
            .filter(|q| matches(&s.names, &q.name))
            .map(qos_row)
            .collect(),
        Entity::Cluster => cluster_rows(r, s, &qos),
    }
}

/// `user`'s associations under the accounts `s` names.
fn user_assocs<'a>(
    r: &'a pb::AssociationsResponse,
    s: &Specs,
    user: &str,
) -> Vec<&'a pb::AssocEntry> {
    r.assocs
        .iter()
        .filter(|a| a.user == user && matches(&s.accounts, &a.account))
        .collect()
}

/// `show user`: a row per user, or per user and association `withassoc`.
fn user_rows(r: &pb::AssociationsResponse, s: &Specs, with_assoc: bool, qos: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for u in r.users.iter().filter(|u| {
        matches(&s.names, &u.name)
            && matches(&s.users, &u.name)
            && (s.accounts.is_empty() || !user_assocs(r, s, &u.name).is_empty())
    }) {
        let user: Row = vec![
            ("User", u.name.clone()),
            ("DefaultAccount", u.default_account.clone()),
            ("AdminLevel", admin_level(u.admin).into()),
            ("Coordinators", u.coordinates.join(",")),
        ];
        if with_assoc {
            for a in user_assocs(r, s, &u.name) {
                let mut row = user.clone();
                row.extend(assoc_row(r, a, qos));
                out.push(row);
            }
        } else {
            out.push(user);
        }
    }
    out
}

/// `show account`: a row per account, or per account and association `withassoc`.
fn account_rows(r: &pb::AssociationsResponse, s: &Specs, with_assoc: bool, qos: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for a in r.accounts.iter().filter(|a| {
        matches(&s.names, &a.name)
            && matches(&s.accounts, &a.name)
            && matches(&s.parents, &a.parent)
    }) {
        let org = organization(r, &a.name);
        let account: Row = vec![
            ("Account", a.name.clone()),
            ("Description", a.name.clone()),
            ("Organization", org),
            ("Coordinators", a.coordinators.join(",")),
        ];
        let parent = ("ParentName", a.parent.clone());
        if with_assoc {
            for assoc in r.assocs.iter().filter(|x| {
                x.account == a.name && (s.users.is_empty() || matches(&s.users, &x.user))
            }) {
                let mut row = account.clone();
                row.extend(assoc_row(r, assoc, qos));
                out.push(row);
            }
        } else {
            let mut row = account;
            row.push(parent);
            out.push(row);
        }
    }
    out
}

/// `show qos`: one QOS's row.
fn qos_row(q: &pb::QosEntry) -> Row {
    let cpus_pu = q.max_cpus_per_user.map(|c| format!("cpu={c}"));
    let grp_tres = q.grp_cpus.map(|c| format!("cpu={c}"));
    vec![
        ("Name", q.name.clone()),
        ("Priority", q.priority.to_string()),
        ("GraceTime", "00:00:00".into()),
        ("Preempt", q.preempt.join(",")),
        ("PreemptMode", q.preempt_mode.to_ascii_lowercase()),
        ("UsageFactor", factor(q.usage_factor)),
        ("GrpTRES", limit(grp_tres)),
        (
            "GrpTRESRunMins",
            limit(q.grp_cpu_run_mins.map(|m| format!("cpu={m}"))),
        ),
        ("GrpJobs", limit(q.grp_jobs)),
        ("MaxWall", limit(q.max_wall_seconds.map(wall))),
        ("MaxTRESPU", limit(cpus_pu)),
        ("MaxJobsPU", limit(q.max_jobs_per_user)),
        ("MaxSubmitPU", limit(q.max_submit_jobs_per_user)),
    ]
}

/// `show cluster`: this cluster's row, unless `s` filters it out.
fn cluster_rows(r: &pb::AssociationsResponse, s: &Specs, qos: &str) -> Vec<Row> {
    if !matches(&s.names, &r.cluster) || !matches(&s.clusters, &r.cluster) {
        return Vec::new();
    }
    let root = r
        .assocs
        .iter()
        .find(|a| a.user.is_empty() && a.parent.is_empty());
    vec![vec![
        ("Cluster", r.cluster.clone()),
        (
            "Share",
            root.map_or_else(|| "1".into(), |a| a.shares.to_string()),
        ),
        ("QOS", qos.to_owned()),
        ("DefaultQOS", r.default_qos.clone()),
    ]]
}

/// Slurm's default organization: the account's top-level ancestor under root (root's own
/// is `root`).
fn organization(r: &pb::AssociationsResponse, account: &str) -> String {
    let parent_of = |name: &str| {
        r.accounts
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.parent.clone())
    };
    let mut at = account.to_owned();
    for _ in 0..r.accounts.len() + 1 {
        match parent_of(&at).as_deref() {
            None | Some("") => return at,
            Some("root") => return at,
            Some(p) => at = p.to_owned(),
        }
    }
    at
}

/// The table, as sacctmgr prints it: right-aligned columns cut to their width with `+`,
/// under a dashed rule; or `|`-separated.
fn table(rows: &[Row], columns: &[Column], header: bool, parsable: Option<&str>) -> String {
    let cell = |row: &Row, c: &Column| {
        row.iter()
            .find(|(f, _)| *f == c.field)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let headers: Vec<&str> = columns
        .iter()
        .map(|c| {
            FIELDS
                .iter()
                .find(|(n, _, _)| *n == c.field)
                .map_or(c.field, |(_, h, _)| *h)
        })
        .collect();
    let mut out = String::new();
    if let Some(end) = parsable {
        if header {
            out.push_str(&format!("{}{end}\n", headers.join("|")));
        }
        for row in rows {
            let cells: Vec<String> = columns.iter().map(|c| cell(row, c)).collect();
            out.push_str(&format!("{}{end}\n", cells.join("|")));
        }
        return out;
    }
    let fit = |v: &str, w: usize| -> String {
        if v.chars().count() > w {
            let cut: String = v.chars().take(w.saturating_sub(1)).collect();
            format!("{cut}+")
        } else {
            format!("{v:>w$}")
        }
    };
    if header {
        let line: Vec<String> = headers
            .iter()
            .zip(columns)
            .map(|(h, c)| fit(h, c.width))
            .collect();
        out.push_str(&line.join(" "));
        out.push('\n');
        let rule: Vec<String> = columns.iter().map(|c| "-".repeat(c.width)).collect();
        out.push_str(&rule.join(" "));
        out.push('\n');
    }
    for row in rows {
        let line: Vec<String> = columns
            .iter()
            .map(|c| fit(&cell(row, c), c.width))
            .collect();
        out.push_str(&line.join(" "));
        out.push('\n');
    }
    out
}

/// What an invocation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Show,
    Delete,
}

/// The verb and the words after it; the other verbs are refused with the way to do them.
fn verb(words: &[String]) -> Result<(Verb, &[String])> {
    let (verb, rest) = words
        .split_first()
        .ok_or_else(|| anyhow!("usage: sacctmgr show|list ENTITY [where] [SPEC...]"))?;
    match verb.to_ascii_lowercase().as_str() {
        "show" | "list" => Ok((Verb::Show, rest)),
        "delete" | "remove" => Ok((Verb::Delete, rest)),
        "add" | "create" | "modify" | "update" => bail!(
            "{verb}: accounts, users, associations and QOS are defined in the site's \
             docket.toml and applied with `docket config apply FILE` (--dry-run shows the \
             change first; --objects-only keeps the scheduler's parameters)"
        ),
        other => bail!("{other:?}: show, list or delete"),
    }
}

/// What `show` prints, from the answer and the arguments.
fn render(r: &pb::AssociationsResponse, a: &SacctmgrArgs) -> Result<String> {
    let (Verb::Show, rest) = verb(&a.words)? else {
        bail!("delete lists nothing");
    };
    let (entity_word, rest) = rest
        .split_first()
        .ok_or_else(|| anyhow!("show what? user, account, association, qos or cluster"))?;
    let entity = Entity::parse(entity_word)?;
    let s = specs(rest)?;
    let with_assoc = a.with_assoc || s.with_assoc;
    let cols = columns(
        s.format
            .as_deref()
            .unwrap_or(entity.default_format(with_assoc)),
    )?;
    // A format naming association fields lists users' and accounts' associations.
    let assoc_field = |c: &Column| {
        matches!(
            c.field,
            "Cluster"
                | "Account"
                | "Partition"
                | "Share"
                | "Priority"
                | "MaxJobs"
                | "QOS"
                | "DefaultQOS"
                | "ParentName"
                | "GrpTRESRunMins"
        )
    };
    let with_assoc = with_assoc
        || (entity == Entity::User
            && cols
                .iter()
                .any(|c| assoc_field(c) && c.field != "DefaultQOS"))
        || (entity == Entity::Account && cols.iter().any(|c| c.field == "User"));
    let rows = rows(r, entity, &s, with_assoc);
    let parsable = if a.parsable2 {
        Some("")
    } else if a.parsable {
        Some("|")
    } else {
        None
    };
    Ok(table(&rows, &cols, !a.noheader, parsable))
}

/// `delete user|account|qos NAME[,NAME...]`: what is removed (kind and names), the
/// removal of whole objects `docket config remove` does. Slurm's removal of one association
/// (`delete user bob account=physics`) has no counterpart: a user's accounts are defined
/// with the user, in docket.toml.
fn deletion(words: &[String]) -> Result<(&'static str, Vec<String>)> {
    let (entity, rest) = words
        .split_first()
        .ok_or_else(|| anyhow!("delete what? user, account or qos, and its name"))?;
    let kind = match Entity::parse(entity)? {
        Entity::User => "user",
        Entity::Account => "account",
        Entity::Qos => "qos",
        Entity::Assoc | Entity::Cluster => bail!(
            "delete {entity}: associations are defined with their users in docket.toml \
             (`docket config apply`); the cluster is not removed"
        ),
    };
    let s = specs(rest)?;
    if !s.accounts.is_empty()
        || !s.users.is_empty()
        || !s.clusters.is_empty()
        || !s.parents.is_empty()
    {
        bail!(
            "delete {kind} with account=, user=, cluster= or parent=: only whole objects are \
             removed here; a user's accounts are changed in docket.toml (`docket config apply`)"
        );
    }
    if s.names.is_empty() {
        bail!("delete {kind}: name the {kind} (`name=NAME` or just NAME)");
    }
    Ok((kind, s.names))
}

pub fn sacctmgr(a: SacctmgrArgs) -> Result<()> {
    if let (Verb::Delete, rest) = verb(&a.words)? {
        let (kind, names) = deletion(rest)?;
        let client = Client::new(a.addr.as_deref())?;
        let rt = runtime()?;
        return crate::stdout::act_then_say(&names, |name| {
            let r = rt.block_on(rpc!(
                client,
                admin_call,
                remove_object,
                crate::client::remove_request(kind, name)
            ))?;
            let why = if r.message.is_empty() {
                String::new()
            } else {
                format!(": {}", r.message)
            };
            Ok((!a.quiet).then(|| format!(" Deleting {kind}: {name}{why}")))
        });
    }
    let client = Client::new(a.addr.as_deref())?;
    let r = runtime()?.block_on(rpc!(
        client,
        jobs_read,
        associations,
        pb::AssociationsRequest {}
    ))?;
    print!("{}", render(&r, &a)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> pb::AssociationsResponse {
        let assoc =
            |account: &str, user: &str, parent: &str, shares: u32, depth: u32| pb::AssocEntry {
                account: account.into(),
                user: user.into(),
                parent: parent.into(),
                shares,
                depth,
                ..Default::default()
            };
        pb::AssociationsResponse {
            cluster: "gadi".into(),
            default_qos: "normal".into(),
            accounts: vec![
                pb::AccountEntry {
                    name: "root".into(),
                    ..Default::default()
                },
                pb::AccountEntry {
                    name: "physics".into(),
                    parent: "root".into(),
                    ..Default::default()
                },
                pb::AccountEntry {
                    name: "astro".into(),
                    parent: "physics".into(),
                    coordinators: vec!["carol".into()],
                },
            ],
            users: vec![
                pb::UserEntry {
                    name: "alice".into(),
                    default_account: "astro".into(),
                    ..Default::default()
                },
                pb::UserEntry {
                    name: "root".into(),
                    default_account: "root".into(),
                    admin: true,
                    ..Default::default()
                },
            ],
            assocs: vec![
                assoc("root", "", "", 1, 0),
                assoc("root", "root", "root", 1, 1),
                assoc("physics", "", "root", 40, 1),
                assoc("astro", "", "physics", 10, 2),
                pb::AssocEntry {
                    max_jobs: Some(8),
                    ..assoc("astro", "alice", "astro", 2, 3)
                },
            ],
            qos: vec![
                pb::QosEntry {
                    name: "express".into(),
                    priority: 1000,
                    preempt: vec!["normal".into()],
                    preempt_mode: "SUSPEND".into(),
                    usage_factor: 2.0,
                    max_wall_seconds: Some(86_400 + 3600),
                    max_cpus_per_user: Some(64),
                    ..Default::default()
                },
                pb::QosEntry {
                    name: "normal".into(),
                    preempt_mode: "OFF".into(),
                    usage_factor: 1.0,
                    ..Default::default()
                },
            ],
        }
    }

    fn run(words: &[&str]) -> Result<String> {
        let a =
            SacctmgrArgs::try_parse_from(std::iter::once("sacctmgr").chain(words.iter().copied()))
                .unwrap();
        render(&site(), &a)
    }

    #[test]
    fn workflow_managers_read_a_users_accounts_as_from_slurm() {
        // Snakemake's and others' checks.
        assert_eq!(
            run(&[
                "-n",
                "-P",
                "show",
                "assoc",
                "where",
                "user=alice",
                "format=account"
            ])
            .unwrap(),
            "astro\n"
        );
        assert_eq!(
            run(&[
                "-n",
                "-s",
                "-P",
                "list",
                "user",
                "alice",
                "format=account%256"
            ])
            .unwrap(),
            "astro\n"
        );
        assert_eq!(
            run(&[
                "-n",
                "-P",
                "show",
                "user",
                "alice",
                "format=user,defaultaccount"
            ])
            .unwrap(),
            "alice|astro\n"
        );
        assert_eq!(run(&["-n", "-P", "show", "user", "nobody"]).unwrap(), "");
    }

    #[test]
    fn default_tables_have_slurms_columns() {
        assert_eq!(
            run(&["show", "user"]).unwrap(),
            "      User   Def Acct     Admin\n\
             ---------- ---------- ---------\n\
             \x20    alice      astro      None\n\
             \x20     root       root Administ+\n"
        );
        let assoc = run(&["-p", "show", "assoc", "account=astro"]).unwrap();
        assert_eq!(
            assoc,
            "Cluster|Account|User|Partition|Share|Priority|GrpJobs|GrpTRES|GrpSubmit|GrpWall|\
             GrpTRESMins|MaxJobs|MaxTRES|MaxTRESPerNode|MaxSubmit|MaxWall|MaxTRESMins|QOS|\
             Def QOS|GrpTRESRunMin|\n\
             gadi|astro|||10|||||||||||||express,normal|normal||\n\
             gadi|astro|alice||2|||||||8||||||express,normal|normal||\n"
        );
    }

    #[test]
    fn qos_accounts_and_the_cluster() {
        assert_eq!(
            run(&[
                "-n",
                "-P",
                "show",
                "qos",
                "format=name,priority,preempt,preemptmode,maxwall,maxtrespu,usagefactor"
            ])
            .unwrap(),
            "express|1000|normal|suspend|1-01:00:00|cpu=64|2.000000\nnormal|0||off|||1.000000\n"
        );
        assert_eq!(
            run(&[
                "-n",
                "-P",
                "show",
                "account",
                "format=account,org,parentname"
            ])
            .unwrap(),
            "root|root|\nphysics|physics|root\nastro|physics|physics\n"
        );
        assert_eq!(
            run(&[
                "-n",
                "-P",
                "show",
                "cluster",
                "format=cluster,share,defaultqos"
            ])
            .unwrap(),
            "gadi|1|normal\n"
        );
    }

    #[test]
    fn whole_users_accounts_and_qos_are_deleted_associations_are_not() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            deletion(&words(&["user", "bob,carol"])).unwrap(),
            ("user", vec!["bob".to_owned(), "carol".to_owned()])
        );
        assert_eq!(
            deletion(&words(&["account", "where", "name=astro"])).unwrap(),
            ("account", vec!["astro".to_owned()])
        );
        let e = deletion(&words(&["user", "bob", "account=physics"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("only whole objects"), "{e}");
        let e = deletion(&words(&["assoc", "user=bob"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("docket config apply"), "{e}");
        assert!(deletion(&words(&["qos"])).is_err());
    }

    #[test]
    fn changes_and_nonsense_are_refused_with_the_way_to_do_them() {
        let e = run(&["add", "user", "bob", "account=astro"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("docket config apply"), "{e}");
        let e = run(&["show", "colours"]).unwrap_err().to_string();
        assert!(e.contains("unknown entity \"colours\""), "{e}");
        let e = run(&["show", "user", "format=user,shoesize"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"shoesize\" is not a field"), "{e}");
        let e = run(&["show", "user", "format=user%999999999"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("up to 1024"), "{e}");
        let e = run(&["show", "user", "colour=red"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"colour\" is not a filter"), "{e}");
        assert!(run(&[]).is_err());
    }
}
