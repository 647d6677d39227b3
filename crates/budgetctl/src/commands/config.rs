//! `budgetctl config check FILE`: validate a configuration and show what it resolves to.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use fleet_budget::BudgetPolicy;
use fleet_budget::config::ConfigError;
use fleet_budget_amqp::WorkerConfig;
use serde::Serialize;

use crate::exit::usage;
use crate::output::{print_json, table_aligned};

/// The version of `config check`'s `--json` shapes, the resolved configuration and its errors
/// (`docs/schemas/config-check.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Validate a configuration file and print the resolved task → dependency map and policies.
    Check(ConfigCheckArgs),
}

/// `config check`.
#[derive(Debug, Args)]
pub(crate) struct ConfigCheckArgs {
    /// The file to check.
    file: PathBuf,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct PolicyView {
    window_secs: f64,
    ratio: f64,
    min_allowance: u64,
    deposit: &'static str,
    mode: &'static str,
}

impl From<&BudgetPolicy> for PolicyView {
    fn from(p: &BudgetPolicy) -> Self {
        Self {
            window_secs: p.window.as_secs_f64(),
            ratio: p.ratio,
            min_allowance: p.min_allowance,
            deposit: p.deposit.as_str(),
            mode: p.mode.as_str(),
        }
    }
}

#[derive(Debug, Serialize)]
struct DependencyView {
    dependency: String,
    #[serde(flatten)]
    policy: PolicyView,
    tasks: Vec<String>,
}

#[derive(Debug, Serialize)]
struct TaskView {
    task: String,
    dependency: String,
    /// Whether the task is mapped explicitly (otherwise it is its own dependency).
    mapped: bool,
    max_attempts: u32,
    backoff_base_ms: u128,
    backoff_cap_ms: u128,
}

#[derive(Debug, Serialize)]
struct CheckReport {
    file: String,
    valid: bool,
    redis_url: String,
    redis_key_prefix: String,
    redis_fallback: &'static str,
    amqp_url: String,
    amqp_prefix: String,
    defaults: PolicyView,
    default_max_attempts: u32,
    dependencies: Vec<DependencyView>,
    tasks: Vec<TaskView>,
}

#[derive(Debug, Serialize)]
struct CheckErrors {
    file: String,
    valid: bool,
    errors: Vec<ErrorView>,
}

#[derive(Debug, Serialize)]
struct ErrorView {
    key: Option<String>,
    value: Option<String>,
    message: String,
}

/// `config check`: prints the resolved configuration, or the errors and exits 2.
pub(crate) fn check(args: &ConfigCheckArgs) -> anyhow::Result<()> {
    let file = args.file.display().to_string();
    let config = match WorkerConfig::from_path(&args.file) {
        Ok(c) => c,
        Err(e) => {
            if args.json {
                print_json(
                    JSON_SCHEMA_VERSION,
                    &CheckErrors {
                        file,
                        valid: false,
                        errors: error_views(&e),
                    },
                )?;
            }
            return Err(usage(e.to_string()));
        }
    };
    let report = resolve(&file, &config);
    if args.json {
        return print_json(JSON_SCHEMA_VERSION, &report);
    }
    print_report(&report);
    Ok(())
}

fn error_views(e: &ConfigError) -> Vec<ErrorView> {
    if e.problems().is_empty() {
        // A parse error quotes the line it failed on, which may hold a password.
        return vec![ErrorView {
            key: None,
            value: None,
            message: fleet_budget::redact::redact_text(&e.to_string()),
        }];
    }
    e.problems()
        .iter()
        .map(|p| ErrorView {
            key: Some(p.key.clone()),
            value: Some(fleet_budget::redact::redact_text(&p.value)),
            message: p.allowed.clone(),
        })
        .collect()
}

fn resolve(file: &str, worker: &WorkerConfig) -> CheckReport {
    let config = &worker.budget;
    let mut dependencies: Vec<DependencyView> = config
        .policies
        .iter()
        .map(|(d, p)| DependencyView {
            dependency: d.to_string(),
            policy: p.into(),
            tasks: Vec::new(),
        })
        .collect();
    let mut tasks = Vec::new();
    let mut names: BTreeSet<String> = config
        .map
        .entries()
        .iter()
        .map(|(t, _)| (*t).to_owned())
        .collect();
    names.extend(config.ceilings.tasks.keys().cloned());
    for task in names {
        let mapped = config.map.is_mapped(&task);
        let dependency = config
            .map
            .resolve(&task)
            .map_or_else(|_| "(invalid name)".to_owned(), |d| d.to_string());
        if let Some(view) = dependencies
            .iter_mut()
            .find(|v| mapped && v.dependency == dependency)
        {
            view.tasks.push(task.clone());
        }
        let ceiling = config.ceilings.for_task(&task);
        tasks.push(TaskView {
            task,
            dependency,
            mapped,
            max_attempts: ceiling.max_attempts,
            backoff_base_ms: ceiling.backoff.base.as_millis(),
            backoff_cap_ms: ceiling.backoff.cap.as_millis(),
        });
    }
    CheckReport {
        file: file.to_owned(),
        valid: true,
        redis_url: config.redis_display(),
        redis_key_prefix: config.redis.key_prefix.clone(),
        redis_fallback: config.redis.fallback.as_str(),
        amqp_url: fleet_budget::redact::redact_url(&worker.amqp.url),
        amqp_prefix: worker.amqp.prefix.clone(),
        defaults: (&config.defaults).into(),
        default_max_attempts: config.ceilings.default.max_attempts,
        dependencies,
        tasks,
    }
}

fn policy_cells(p: &PolicyView) -> Vec<String> {
    vec![
        format!("{}s", p.window_secs),
        p.ratio.to_string(),
        p.min_allowance.to_string(),
        p.deposit.to_owned(),
        p.mode.to_owned(),
    ]
}

fn print_report(r: &CheckReport) {
    outln!("{}: valid", r.file);
    outln!(
        "redis: {} (keys under `{}`, fallback {})",
        r.redis_url,
        r.redis_key_prefix,
        r.redis_fallback
    );
    outln!("amqp:  {} (names under `{}`)", r.amqp_url, r.amqp_prefix);
    outln!();
    outln!("policies:");
    let mut rows = vec![
        [
            "dependency",
            "window",
            "ratio",
            "min_allowance",
            "deposit",
            "mode",
            "tasks",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    let mut defaults = vec!["(defaults)".to_owned()];
    defaults.extend(policy_cells(&r.defaults));
    defaults.push(format!("max_attempts {}", r.default_max_attempts));
    rows.push(defaults);
    for d in &r.dependencies {
        let mut row = vec![d.dependency.clone()];
        row.extend(policy_cells(&d.policy));
        row.push(if d.tasks.is_empty() {
            "-".to_owned()
        } else {
            d.tasks.join(", ")
        });
        rows.push(row);
    }
    out!("{}", table_aligned(&rows, &[0, 4, 5, 6]));
    outln!();
    outln!("task -> dependency (unlisted tasks are their own dependency, with the defaults):");
    let mut rows = vec![
        ["task", "dependency", "max_attempts", "backoff"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for t in &r.tasks {
        rows.push(vec![
            t.task.clone(),
            if t.mapped {
                t.dependency.clone()
            } else {
                format!("{} (own)", t.dependency)
            },
            t.max_attempts.to_string(),
            format!("{} ms .. {} ms", t.backoff_base_ms, t.backoff_cap_ms),
        ]);
    }
    if r.tasks.is_empty() {
        outln!("  (no tasks listed)");
    } else {
        out!("{}", table_aligned(&rows, &[0, 1, 3]));
    }
}
