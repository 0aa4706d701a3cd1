//! The kubeconfig reader: any text in a kubeconfig file resolves to a
//! context or is refused with an error; never a panic. The file sits alone
//! in a directory of its own, so relative file references name nothing.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        // scripts/fuzz.sh gives a directory in memory (a tmpfs) and removes
        // it after: a file written each run is the slow part.
        let base =
            std::env::var_os("TOLLGATE_FUZZ_TMP").map_or_else(std::env::temp_dir, PathBuf::from);
        let dir = base.join(format!("kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        dir.join("config")
    })
}

fuzz_target!(|data: &[u8]| {
    let path = file();
    std::fs::write(path, data).expect("writing the kubeconfig");
    if let Ok(ctx) = kubeio::kubeconfig::load_file(path) {
        let _ = ctx.identity_pem();
    }
});
