//! Finding the workspace's binaries (`tollgate-bench`, later `tollgate`, `loadgen`).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The path of workspace binary `name`, found next to the running test executable: a test
/// runs from `target/<profile>/deps/`, the binaries are in `target/<profile>/`.
///
/// Panics with what to do when it is missing: `cargo test -p tests` builds the `tests`
/// package and its libraries, not the other packages' binaries.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test executable");
    let file = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let mut looked = Vec::new();
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join(&file);
        if candidate.is_file() {
            return candidate;
        }
        looked.push(candidate.display().to_string());
    }
    panic!(
        "the `{name}` binary was not found next to the test executable (looked at {}). \
         Build the workspace first: `cargo build --workspace` (`cargo test --workspace` and \
         `cargo nextest run --workspace` build every binary; `cargo test -p tests` alone does not)",
        looked.join(", ")
    );
}

/// [`workspace_binary`], and fails loudly if it was built from older sources than the test
/// executable running now: if a source file of the workspace packages it is built from
/// (`packages`: their directories, e.g. `["bench", "apimodel"]`) changed after the binary was
/// built but before this test was. That is what `cargo test -p tests` leaves behind after a
/// change to those packages (it rebuilds their libraries, which the test links, but not their
/// binaries), and a test of a stale binary tests code that no longer exists. Files changed
/// after the test was built too (someone editing while tests run) are not looked at.
pub fn fresh_workspace_binary(name: &str, packages: &[&str]) -> PathBuf {
    let binary = workspace_binary(name);
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let test_exe = std::env::current_exe().ok();
    let (Some(built), Some(test_built)) =
        (modified(&binary), test_exe.as_deref().and_then(modified))
    else {
        return binary;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new(".."));
    for package in packages {
        let dir = root.join(package);
        let mut files = Vec::new();
        for p in [dir.join("Cargo.toml"), dir.join("src")] {
            collect_files(&p, &mut files);
        }
        // Other binaries of the package (`src/bin/OTHER.rs`, `src/bin/OTHER/…`) are not part
        // of this one: a change there must not make it look stale (cargo does not relink it).
        let other_bins = dir.join("src").join("bin");
        let newest = files
            .into_iter()
            .filter(|(_, p)| !is_other_binary(p, &other_bins, name))
            .filter(|(t, _)| *t <= test_built)
            .max_by_key(|(t, _)| *t);
        if let Some((changed, path)) = newest {
            if changed > built {
                panic!(
                    "{} is older than {}, which the test was built with: rebuild it first \
                     with `cargo build -p {}` (`cargo test --workspace` and \
                     `cargo nextest run --workspace` rebuild every binary)",
                    binary.display(),
                    path.display(),
                    package_name(&dir).unwrap_or_else(|| package.to_string()),
                );
            }
        }
    }
    binary
}

/// Whether `path` is the source of another binary than `name` in `bin_dir` (`src/bin/`).
fn is_other_binary(path: &Path, bin_dir: &Path, name: &str) -> bool {
    let Ok(rest) = path.strip_prefix(bin_dir) else {
        return false;
    };
    let first = rest
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy());
    match first {
        Some(first) => first != name && first != format!("{name}.rs"),
        None => false,
    }
}

/// Every file under `path` (a file or a directory tree), with its modification time, but for
/// unit-test modules (`tests.rs`, `*_tests.rs`): only `cfg(test)` builds read them, so a change
/// there does not relink a binary and would make it look stale for ever.
fn collect_files(path: &Path, out: &mut Vec<(SystemTime, PathBuf)>) {
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let name = path.file_name().map(|n| n.to_string_lossy());
    if name.is_some_and(|n| n == "tests.rs" || n.ends_with("_tests.rs")) {
        return;
    }
    if meta.is_file() {
        if let Ok(t) = meta.modified() {
            out.push((t, path.to_path_buf()));
        }
    } else if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.filter_map(Result::ok) {
            collect_files(&e.path(), out);
        }
    }
}

/// `name = "…"` of the package whose directory is `dir`.
fn package_name(dir: &Path) -> Option<String> {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
    manifest.lines().find_map(|l| {
        let value = l.trim().strip_prefix("name")?.trim().strip_prefix('=')?;
        Some(value.trim().trim_matches('"').to_string())
    })
}

/// `tollgate-bench` as a command, with `tollgate` and `loadgen` (which its `capacity` and
/// `demo` start as children) pointed at this workspace's fresh binaries, stdin closed.
pub fn bench_command() -> std::process::Command {
    let mut c = std::process::Command::new(fresh_workspace_binary(
        "tollgate-bench",
        &["bench", "kubeio", "apimodel"],
    ));
    c.env(
        "LOADGEN_BIN",
        fresh_workspace_binary("loadgen", &["loadgen", "kubeio", "apimodel"]),
    )
    .env(
        "TOLLGATE_BIN",
        fresh_workspace_binary("tollgate", &["proxy", "kubeio", "apimodel"]),
    )
    .stdin(std::process::Stdio::null());
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_binaries_sources_are_not_this_ones() {
        let bin = Path::new("/ws/bench/src/bin");
        assert!(is_other_binary(
            Path::new("/ws/bench/src/bin/minproxy.rs"),
            bin,
            "tollgate-bench"
        ));
        assert!(is_other_binary(
            Path::new("/ws/bench/src/bin/other/main.rs"),
            bin,
            "tollgate-bench"
        ));
        assert!(!is_other_binary(
            Path::new("/ws/bench/src/bin/minproxy.rs"),
            bin,
            "minproxy"
        ));
        assert!(!is_other_binary(
            Path::new("/ws/bench/src/sim/api.rs"),
            bin,
            "tollgate-bench"
        ));
    }
}
