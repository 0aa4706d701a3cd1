//! `loadgen:` and `etcd:` phases: their flags rendered, split as a shell would, and parsed by
//! the command's own parser (`crate::cli`), so a phase refuses what the command would.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Checker, Phase, PhaseKind};
use crate::scenario::file::PhaseFile;
use crate::scenario::template::{Context, Template};
use crate::scenario::ScenarioError;

/// Flags a phase may not set: `loadgen run` and the phase's `duration` own them.
const RESERVED_FLAGS: &[&str] = &[
    "--server",
    "--kubeconfig",
    "--context",
    "--token",
    "--certificate-authority",
    "--client-certificate",
    "--client-key",
    "--insecure-skip-tls-verify",
    "--output",
    "--duration",
    "--dry-run",
    "--shard",
    "--metrics-listen",
];

impl Checker<'_> {
    /// A `loadgen:` or `etcd:` phase: its flags rendered, split as a shell
    /// would, and checked as the command would check them.
    pub(super) fn flag_phase(
        &self,
        path: &str,
        p: &PhaseFile,
        params: &BTreeMap<String, Value>,
        namespaces: &[String],
        name: String,
    ) -> Result<Phase, ScenarioError> {
        for (field, set) in [
            ("namespaceRange", p.namespace_range.is_some()),
            ("replicasPerNamespace", p.replicas_per_namespace.is_some()),
            ("tuningSet", p.tuning_set.is_some()),
        ] {
            if set {
                return Err(self.err(
                    &format!("{path}.{field}"),
                    "only an objectBundle phase takes this",
                ));
            }
        }
        let Some(duration) = &p.duration else {
            return Err(self.err(path, "a loadgen or etcd phase needs `duration`"));
        };
        let duration = self.duration(&format!("{path}.duration"), duration)?;
        let (field, flags) = match (&p.loadgen, &p.etcd) {
            (Some(l), _) => ("loadgen", l),
            (_, Some(e)) => ("etcd", e),
            _ => unreachable!("exactly one kind was checked above"),
        };
        let fpath = format!("{path}.{field}");
        let rendered = Template::parse(flags, params)
            .map_err(|e| self.err(&fpath, e.reason))?
            .render(
                &Context {
                    name: "",
                    namespace: "",
                    n: 0,
                    params,
                },
                &mut rand::rng(),
            );
        let mut args =
            shlex::split(&rendered).ok_or_else(|| self.err(&fpath, "unbalanced quotes"))?;
        if let Some(flag) = args.iter().find(|a| {
            RESERVED_FLAGS
                .iter()
                .any(|r| a.as_str() == *r || a.starts_with(&format!("{r}=")))
        }) {
            return Err(self.err(
                &fpath,
                format!(
                    "{flag} is set by `loadgen run` (target, output) or by the phase's `duration`"
                ),
            ));
        }
        let secs = format!("{}s", duration.as_secs_f64());
        if field == "etcd" {
            args.splice(0..0, ["--duration".to_string(), secs]);
            crate::scenario::etcd_phase::check(&args).map_err(|r| self.err(&fpath, r))?;
            return Ok(Phase {
                name,
                kind: PhaseKind::Etcd(args),
            });
        }
        let has_ns = args
            .iter()
            .any(|a| a == "-n" || a == "--namespace" || a.starts_with("--namespace="));
        let mut argv = vec![
            "loadgen".to_string(),
            "--no-progress".into(),
            "--duration".into(),
            secs,
        ];
        if !has_ns {
            if let Some(first) = namespaces.first() {
                argv.extend(["--namespace".to_string(), first.clone()]);
            }
        }
        argv.extend(args);
        let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(&argv)
            .map_err(|e| self.err(&fpath, e.render().to_string().trim().to_string()))?;
        if cli.command.is_some() {
            return Err(self.err(&fpath, "run flags only, not a subcommand"));
        }
        let config = cli
            .into_config()
            .map_err(|e| self.err(&fpath, e.to_string()))?;
        Ok(Phase {
            name,
            kind: PhaseKind::Load(Box::new(config)),
        })
    }
}
