//! deploy/images/Containerfile's build stage, checked against what the build needs on this
//! (Debian) machine, since the file itself cannot be built without a registry:
//! - every `google/protobuf/*.proto` that etcd-client's `.proto` files import and do not ship
//!   is, on this machine, a file of a package the build stage installs (`dpkg -S`): protoc
//!   alone (protobuf-compiler) has no includes;
//! - the revision passed as `--build-arg REVISION` reaches tollgate's build script as
//!   `TOLLGATE_REVISION` before `cargo build` runs (the context has no `.git`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

use crate::podman::repo_root;

/// The lines of the Containerfile's `build` stage, trimmed, continuation lines joined.
fn build_stage() -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(repo_root().join("deploy/images/Containerfile"))?;
    let joined = text.replace("\\\n", " ");
    let lines: Vec<String> = joined
        .lines()
        .map(str::trim)
        .skip_while(|l| !(l.starts_with("FROM ") && l.ends_with(" AS build")))
        .enumerate()
        .take_while(|(i, l)| *i == 0 || !l.starts_with("FROM "))
        .map(|(_, l)| l.to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    anyhow::ensure!(!lines.is_empty(), "no build stage");
    Ok(lines)
}

/// etcd-client's source directory, from `cargo metadata`.
fn etcd_client_dir() -> anyhow::Result<PathBuf> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(repo_root())
        .args(["metadata", "--format-version", "1", "--locked"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let manifest = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "etcd-client")
        .and_then(|p| p["manifest_path"].as_str())
        .context("no etcd-client in cargo metadata")?;
    Ok(PathBuf::from(manifest)
        .parent()
        .context("manifest path")?
        .to_path_buf())
}

fn protos(dir: &std::path::Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            protos(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "proto") {
            out.push(p);
        }
    }
    Ok(())
}

#[test]
fn build_stage_installs_protoc_includes_and_passes_the_revision() -> anyhow::Result<()> {
    let stage = build_stage()?;
    let installed: BTreeSet<String> = stage
        .iter()
        .filter_map(|l| l.split("apt-get install").nth(1))
        .flat_map(|rest| rest.split("&&").next().unwrap_or("").split_whitespace())
        .filter(|w| !w.starts_with('-'))
        .map(str::to_string)
        .collect();
    assert!(installed.contains("protobuf-compiler"), "{installed:?}");

    let dir = etcd_client_dir()?.join("proto");
    let mut files = Vec::new();
    protos(&dir, &mut files)?;
    let mut imports = BTreeSet::new();
    for f in &files {
        for l in std::fs::read_to_string(f)?.lines() {
            if let Some(i) = l.trim().strip_prefix("import \"google/protobuf/") {
                let name = i.trim_end_matches(';').trim_end_matches('"');
                if !dir.join("google/protobuf").join(name).exists() {
                    imports.insert(format!("/usr/include/google/protobuf/{name}"));
                }
            }
        }
    }
    assert!(
        !imports.is_empty(),
        "etcd-client imports no google/protobuf file: the check is moot"
    );
    for path in &imports {
        let out = Command::new("dpkg").args(["-S", path]).output()?;
        let owner = String::from_utf8_lossy(&out.stdout);
        let package = owner.split(':').next().unwrap_or("").trim();
        assert!(
            out.status.success() && installed.contains(package),
            "{path} (imported by etcd-client) comes from {owner:?}, which the build stage does not install ({installed:?})"
        );
    }

    let arg = stage.iter().position(|l| l.starts_with("ARG REVISION"));
    let env = stage
        .iter()
        .position(|l| l.replace(' ', "") == "ENVTOLLGATE_REVISION=${REVISION}");
    let build = stage.iter().position(|l| l.contains("cargo build"));
    assert!(
        matches!((arg, env, build), (Some(a), Some(e), Some(b)) if a < e && e < b),
        "REVISION must reach cargo build as TOLLGATE_REVISION: {stage:#?}"
    );
    let script = std::fs::read_to_string(repo_root().join("proxy/build.rs"))?;
    assert!(script.contains("std::env::var(\"TOLLGATE_REVISION\")"));
    Ok(())
}
