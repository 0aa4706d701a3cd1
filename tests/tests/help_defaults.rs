//! `--help` and the READMEs agree: every flag a README's flag table lists exists in the
//! binary's `--help`, and the defaults they give carry the same values (the numbers and
//! addresses, and the words that name a default: none, required, off, adaptive, …). Tables
//! checked: proxy/README.md "Flags" against `tollgate --help`; README.md's simulator "Flags"
//! against `tollgate-bench sim --help`; loadgen/README.md's etcd table against `loadgen etcd
//! --help`; and the demo's runs and durations in README.md against `tollgate-bench demo --help`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::Context;
use tests::fresh_workspace_binary;

fn read(rel: &str) -> anyhow::Result<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(rel)).with_context(|| format!("reading {rel}"))
}

fn help(binary: &str, packages: &[&str], args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(fresh_workspace_binary(binary, packages))
        .args(args)
        .env("COLUMNS", "1000")
        .output()
        .with_context(|| format!("running {binary} {}", args.join(" ")))?;
    anyhow::ensure!(out.status.success(), "{binary} {args:?} failed");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Each long flag of a clap `--help` with the text of its `[default: …]` (empty if none).
fn help_defaults(help: &str) -> BTreeMap<String, String> {
    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Vec<String> = Vec::new();
    let mut text = String::new();
    let mut flush = |current: &mut Vec<String>, text: &mut String| {
        let default = text
            .find("[default: ")
            .map(|i| {
                let rest = &text[i + "[default: ".len()..];
                rest[..rest.find(']').unwrap_or(rest.len())].to_string()
            })
            .unwrap_or_default();
        for f in current.drain(..) {
            flags.insert(f, default.clone());
        }
        text.clear();
    };
    for line in help.lines() {
        let t = line.trim_start();
        if t.starts_with("--") || (t.starts_with('-') && t.contains(", --")) {
            flush(&mut current, &mut text);
            current = t
                .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[')
                .filter(|w| w.starts_with("--"))
                .map(|w| w.trim_end_matches(']').to_string())
                .collect();
        }
        text.push(' ');
        text.push_str(t);
    }
    flush(&mut current, &mut text);
    flags
}

/// The rows of the markdown table under `heading` (the first table after it): (flags named in
/// the first cell, the second cell).
fn table(readme: &str, heading: &str) -> anyhow::Result<Vec<(Vec<String>, String)>> {
    let start = readme
        .find(heading)
        .with_context(|| format!("no {heading:?}"))?;
    let mut rows = Vec::new();
    let mut seen_table = false;
    for line in readme[start..].lines().skip(1) {
        if !line.starts_with('|') {
            if seen_table {
                break;
            }
            continue;
        }
        seen_table = true;
        let cells: Vec<&str> = line.split(" | ").collect();
        if cells.len() < 2 || cells[0].contains("---") || cells[0].contains("| flag") {
            continue;
        }
        let flags: Vec<String> = cells[0]
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|code| code.split_whitespace().next())
            .filter(|w| w.starts_with("--"))
            .map(|w| w.split(['[', '=']).next().unwrap_or(w).to_string())
            .collect();
        rows.push((flags, cells[1].to_string()));
    }
    Ok(rows)
}

/// What must agree in a default: numbers and addresses, and the words that say what a
/// default is.
fn significant(text: &str) -> BTreeSet<String> {
    const WORDS: [&str; 10] = [
        "none", "required", "off", "on", "adaptive", "static", "dryRun", "any", "true", "false",
    ];
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == ':' || c == '_'))
        .map(|w| w.trim_matches(|c| c == '.' || c == ':'))
        .filter(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) || WORDS.contains(w))
        .map(|w| match w {
            "false" => "off".to_string(),
            "true" => "on".to_string(),
            w => w.replace('_', ""),
        })
        .collect()
}

/// Every flag of the table is in `--help`, with the same significant default values.
fn agree(readme: &str, heading: &str, help: &str, what: &str) -> anyhow::Result<usize> {
    let defaults = help_defaults(help);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (flags, documented) in table(readme, heading)? {
        for flag in &flags {
            let Some(from_help) = defaults.get(flag) else {
                wrong.push(format!("{flag}: in the README, not in `{what} --help`"));
                continue;
            };
            checked += 1;
            // A row naming several flags gives one default each (`0, 0, 1`, `a / b`) or one
            // for all: compare each with its own, or the first with the whole.
            let parts: Vec<&str> = [" / ", ", "]
                .iter()
                .map(|sep| documented.split(*sep).collect::<Vec<_>>())
                .find(|p| flags.len() > 1 && p.len() == flags.len())
                .unwrap_or_else(|| vec![documented.as_str()]);
            let Some(i) = flags
                .iter()
                .position(|f| f == flag)
                .filter(|i| *i < parts.len())
            else {
                continue;
            };
            let documented = parts[i];
            if documented.contains("as for a run") {
                continue;
            }
            let (mut a, b) = (significant(documented), significant(from_help));
            // No default in --help (none, or one that depends on other flags): only the
            // README's numbers must be absent.
            if from_help.is_empty() {
                a.retain(|w| w.starts_with(|c: char| c.is_ascii_digit()));
            }
            if a != b {
                wrong.push(format!(
                    "{flag}: README says {documented:?}, `{what} --help` says [default: {from_help}]"
                ));
            }
        }
    }
    anyhow::ensure!(wrong.is_empty(), "{what}:\n{}", wrong.join("\n"));
    Ok(checked)
}

#[test]
fn the_significant_values_of_a_default() {
    assert_eq!(
        significant(
            "`268435456`; adaptive: no ceiling but `quota.adaptive.maxBytesPerSecond`, 4 GiB/s"
        ),
        significant(
            "268435456; adaptive: no ceiling but quota.adaptive.maxBytesPerSecond, 4 GiB/s"
        )
    );
    assert_ne!(
        significant("`1073741824`"),
        significant("1073741824; adaptive: one second of the rate")
    );
    assert_eq!(
        significant("`127.0.0.1:9443`"),
        significant("127.0.0.1:9443")
    );
    assert_eq!(
        significant("none (plain HTTP)"),
        significant("none, plain HTTP")
    );
}

#[test]
fn tollgate_help_and_its_readme_agree() -> anyhow::Result<()> {
    let help = help("tollgate", &["proxy", "kubeio", "apimodel"], &["--help"])?;
    let checked = agree(&read("proxy/README.md")?, "## Flags", &help, "tollgate")?;
    assert!(checked >= 25, "{checked} flags checked");
    Ok(())
}

#[test]
fn the_simulators_help_and_the_readme_agree() -> anyhow::Result<()> {
    let help = help(
        "tollgate-bench",
        &["bench", "kubeio", "apimodel"],
        &["sim", "--help"],
    )?;
    let checked = agree(
        &read("README.md")?,
        "### Flags",
        &help,
        "tollgate-bench sim",
    )?;
    assert!(checked >= 25, "{checked} flags checked");
    Ok(())
}

#[test]
fn loadgen_etcds_help_and_its_readme_agree() -> anyhow::Result<()> {
    let help = help(
        "loadgen",
        &["loadgen", "kubeio", "apimodel"],
        &["etcd", "--help"],
    )?;
    let checked = agree(
        &read("loadgen/README.md")?,
        "## Direct etcd load",
        &help,
        "loadgen etcd",
    )?;
    assert!(checked >= 10, "{checked} flags checked");
    Ok(())
}

/// The demo's runs and durations as README.md tells them, from `tollgate-bench demo --help`.
#[test]
fn the_demos_runs_and_durations_agree() -> anyhow::Result<()> {
    let help = help(
        "tollgate-bench",
        &["bench", "kubeio", "apimodel"],
        &["demo", "--help"],
    )?;
    let readme = read("README.md")?;
    let start = readme
        .find("## The demo and the reports")
        .context("demo section")?;
    let demo = &readme[start..];
    let demo = &demo[..demo[3..].find("\n## ").map_or(demo.len(), |e| e + 3)];
    let defaults = help_defaults(&help);
    // `[default: 35; --quick: 10]`: the full and the quick value.
    let pair = |flag: &str| -> anyhow::Result<(String, String)> {
        let d = defaults
            .get(flag)
            .with_context(|| format!("{flag} in demo --help"))?;
        let (full, quick) = d
            .split_once("; --quick: ")
            .with_context(|| format!("{flag}: {d:?}"))?;
        Ok((full.trim().to_string(), quick.trim().to_string()))
    };
    let with_commas = |n: &str| -> String {
        let digits: Vec<char> = n.chars().collect();
        let mut out = String::new();
        for (i, c) in digits.iter().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(*c);
        }
        out
    };
    let (seconds, quick_seconds) = pair("--seconds")?;
    let (nodes, quick_nodes) = pair("--nodes")?;
    let (pods, quick_pods) = pair("--pods")?;
    let (lists, quick_lists) = pair("--lists-per-minute")?;
    let pools = defaults
        .get("--static-pools")
        .context("--static-pools")?
        .trim()
        .to_string();
    let runs = 4 + pools.parse::<usize>()?;
    let words = [
        "", "one", "two", "three", "four", "five", "six", "seven", "eight",
    ];
    for said in [
        format!("{} runs of {seconds} s", words[runs]),
        format!(
            "{} nodes and {} pods",
            with_commas(&nodes),
            with_commas(&pods)
        ),
        format!("{lists} consistent LIST-all-pods per minute"),
        format!(
            "{quick_nodes} nodes, {} pods, {quick_seconds}-second runs, {quick_lists}\nLISTs/min",
            with_commas(&quick_pods)
        ),
    ] {
        let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        anyhow::ensure!(
            flat(demo).contains(&flat(&said)),
            "README.md's demo section does not say {said:?} (from `tollgate-bench demo --help`)"
        );
    }
    // `--quick` itself says the same.
    let quick = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("--quick"))
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    anyhow::ensure!(
        quick.contains(&format!("{quick_seconds}-second runs")),
        "--quick's help: {quick}"
    );
    Ok(())
}
