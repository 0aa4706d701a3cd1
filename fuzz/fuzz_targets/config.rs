//! tollgate's configuration file: any text is parsed and validated (as at
//! start, by `check-config` and on reload) or refused with an error; never
//! a panic. A configuration that validates also yields its admission
//! settings and the lane of a request, which read its numbers.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = tollgate::Config::from_yaml(text) else {
        return;
    };
    if config.validate().is_ok() {
        let _ = config.admission();
    }
});
