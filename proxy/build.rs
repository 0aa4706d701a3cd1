//! `TOLLGATE_REVISION`: the git commit tollgate is built from, for `tollgate_build_info` and
//! `--version`. Taken from the environment when set (an image build without `.git`), else from
//! `git rev-parse HEAD`; `unknown` when neither works (a source tarball, no git installed).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TOLLGATE_REVISION");
    let revision = match std::env::var("TOLLGATE_REVISION") {
        Ok(r) if !r.trim().is_empty() => r.trim().to_string(),
        _ => git_revision().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=TOLLGATE_REVISION={revision}");
}

/// `git rev-parse HEAD` (12 hex digits) in this package's directory, and the files whose
/// change means a new commit (so cargo runs this again only then).
fn git_revision() -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from)?;
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&dir)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
    };
    let revision = git(&["rev-parse", "--short=12", "HEAD"])?;
    let absolute = |p: String| {
        let p = PathBuf::from(p);
        if p.is_absolute() {
            p
        } else {
            dir.join(p)
        }
    };
    // HEAD names the branch; the branch's ref file (or packed-refs) moves with each commit.
    if let Some(git_dir) = git(&["rev-parse", "--git-dir"]).map(absolute) {
        watch(&git_dir.join("HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]).map(absolute) {
        watch(&common.join("packed-refs"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(&common.join(branch));
        }
    }
    Some(revision)
}

fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
