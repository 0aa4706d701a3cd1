//! `scripts/deps.sh`'s check of protoc's includes: a protoc whose
//! `google/protobuf/descriptor.proto` cannot be found fails the script with a message
//! that names the file, where it looked and the fix — before etcd-client's build fails
//! on it. Hermetic: a fake `protoc`, `make` and `cargo-nextest` first on `PATH`, so the
//! script finds nothing to install (it never reaches `apt-get` or `cargo install`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn deps_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/deps.sh")
}

/// A directory of executables that exit 0, named `names`.
fn fake_bin(root: &Path, names: &[&str]) -> anyhow::Result<PathBuf> {
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin)?;
    for n in names {
        let p = bin.join(n);
        std::fs::write(&p, "#!/bin/sh\nexit 0\n")?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(bin)
}

/// An include directory holding `google/protobuf/descriptor.proto`.
fn includes(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("google/protobuf"))?;
    std::fs::write(
        dir.join("google/protobuf/descriptor.proto"),
        "syntax = \"proto2\";\n",
    )?;
    Ok(())
}

fn run(bin: &Path, protoc_include: Option<&Path>) -> anyhow::Result<Output> {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.arg(deps_sh())
        .env("PATH", path)
        .env_remove("PROTOC_INCLUDE");
    if let Some(dir) = protoc_include {
        cmd.env("PROTOC_INCLUDE", dir);
    }
    Ok(cmd.output()?)
}

#[test]
fn a_protoc_without_its_includes_fails_with_a_clear_message() -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let bin = fake_bin(root.path(), &["protoc", "make", "cargo-nextest"])?;
    let empty = root.path().join("empty-include");
    std::fs::create_dir_all(&empty)?;
    let out = run(&bin, Some(&empty))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("google/protobuf/descriptor.proto"),
        "{stderr}"
    );
    assert!(stderr.contains(&*empty.to_string_lossy()), "{stderr}");
    assert!(
        stderr.contains(&*bin.join("protoc").to_string_lossy()),
        "{stderr}"
    );
    assert!(stderr.contains("libprotobuf-dev"), "{stderr}");
    assert!(
        !stderr.contains("installing"),
        "nothing installed: {stderr}"
    );
    Ok(())
}

#[test]
fn protocs_includes_are_found_in_protoc_include_or_beside_protoc() -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let bin = fake_bin(root.path(), &["protoc", "make", "cargo-nextest"])?;
    // PROTOC_INCLUDE, as prost-build reads it.
    let inc = root.path().join("inc");
    includes(&inc)?;
    let out = run(&bin, Some(&inc))?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A protoc release unpacked: bin/protoc beside include/google/protobuf.
    includes(&root.path().join("include"))?;
    let out = run(&bin, None)?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
