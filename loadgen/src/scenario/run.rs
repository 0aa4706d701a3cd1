//! A scenario run: namespaces created, steps in series (a step's phases in
//! parallel, or its measurements started/gathered), results written per step,
//! namespaces deleted — also when a step fails or the run is interrupted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kubeio::error_chain;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::measure::{self, Active, ApiCalls, MeasureCtx, MeasurementResult};
use super::output::{self, CleanupReport, PhaseReport, ScenarioReport, StepReport, Verdict};
use super::reconcile::{self, Live, ReconcileCtx};
use super::validate::{Action, MeasurementAction, Method, Phase, PhaseKind, Scenario, StepBody};
use super::{namespaces, ScenarioError};
use crate::send::SendOptions;
use crate::target::{ApiClient, Target, TargetOptions};

/// How to run a scenario: where, and where the results go.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub target: TargetOptions,
    /// The run's output dir (`step-NN-<name>/…`, `summary.json`); none: nothing written.
    pub output: Option<PathBuf>,
    /// For `etcd:` phases that name no `--endpoints`.
    pub etcd_endpoints: Option<String>,
    /// For ResourceUsage measurements that name no URLs.
    pub server_metrics: Vec<String>,
    /// How the reconcile's calls are sent (timeout, 429 retries).
    pub send: SendOptions,
    /// Seeds RAND in templates and the random tuning sets.
    pub seed: u64,
    /// After a signal, how long a load phase's in-flight requests may still
    /// finish (at most; a phase's own `--drain-timeout` may be shorter).
    pub drain_timeout: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            target: TargetOptions::default(),
            output: None,
            etcd_endpoints: None,
            server_metrics: Vec::new(),
            send: SendOptions {
                honor_retry_after: true,
                ..SendOptions::default()
            },
            seed: 1,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

struct Runner<'a> {
    scenario: &'a Scenario,
    opts: &'a RunOptions,
    target: Target,
    client: ApiClient,
    live: Live,
    shutdown: CancellationToken,
}

/// Runs `scenario`. An `Err` means it could not start (unreachable target,
/// namespaces refused); a failed step is in the report (`error`, verdict
/// `fail`), after which the run still cleans up.
pub async fn run(
    scenario: &Scenario,
    opts: &RunOptions,
    shutdown: CancellationToken,
) -> Result<ScenarioReport, ScenarioError> {
    let needs_api = needs_api(scenario);
    let (target, client) = if needs_api {
        connect(&opts.target).await?
    } else {
        offline(&opts.target)?
    };
    if let Some(dir) = &opts.output {
        std::fs::create_dir_all(dir).map_err(|source| ScenarioError::Output {
            dir: dir.clone(),
            source,
        })?;
    }
    let runner = Runner {
        scenario,
        opts,
        live: Live::with_managed(&scenario.namespaces),
        client,
        target,
        shutdown,
    };
    for part in &scenario.skipped {
        tracing::warn!("not run (loadgen does not implement it): {part}");
    }
    let started_at = crate::ops::unix_nanos();
    let start = Instant::now();
    let mut created = Vec::new();
    let mut setup_error = None;
    for ns in &scenario.namespaces {
        match namespaces::create(&runner.client, ns, &label(&scenario.name)).await {
            Ok(()) => created.push(ns.clone()),
            Err(e) => {
                setup_error = Some(e);
                break;
            }
        }
    }
    let shown = if needs_api {
        runner.target.server.to_string()
    } else {
        "(no API server: etcd phases only)".to_string()
    };
    let mut report = ScenarioReport::new(scenario, &shown, started_at);
    if setup_error.is_none() {
        runner.steps(&mut report).await;
    } else {
        report.error = setup_error.clone();
    }
    report.cleanup = runner.cleanup(&created).await;
    report.duration_s = start.elapsed().as_secs_f64();
    report.interrupted = runner.shutdown.is_cancelled();
    report.verdict = Verdict::of(&report);
    if let Some(dir) = &opts.output {
        output::write_top(dir, &report).map_err(|source| ScenarioError::Output {
            dir: dir.clone(),
            source,
        })?;
    }
    match setup_error {
        Some(reason) => Err(ScenarioError::Namespaces { reason }),
        None => Ok(report),
    }
}

/// Resolves the target and checks it answers: the client the run's own calls use.
pub async fn connect(options: &TargetOptions) -> Result<(Target, ApiClient), ScenarioError> {
    // Ignore the error: a provider is already installed (by us or the embedder).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let target = options.resolve()?;
    let client = ApiClient::new(&target);
    namespaces::preflight(&client)
        .await
        .map_err(|reason| ScenarioError::Unreachable {
            server: target.server.to_string(),
            reason,
        })?;
    Ok((target, client))
}

/// Whether the scenario talks to an API server at all (an etcd-only one need not).
fn needs_api(s: &Scenario) -> bool {
    !s.namespaces.is_empty()
        || s.steps.iter().any(|step| match &step.body {
            StepBody::Phases(ps) => ps.iter().any(|p| !matches!(p.kind, PhaseKind::Etcd(_))),
            StepBody::Measurements(ms) => ms.iter().any(|m| {
                !matches!(
                    m.method,
                    Method::ApiResponsiveness
                        | Method::ResourceUsage
                        | Method::Sleep
                        | Method::Skipped
                )
            }),
        })
}

/// For an etcd-only scenario: the target if one resolves (its credentials may
/// serve `--server-metrics`), else a placeholder that is never called.
fn offline(options: &TargetOptions) -> Result<(Target, ApiClient), ScenarioError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let target = match options.resolve() {
        Ok(t) => t,
        Err(_) => TargetOptions {
            server: Some("http://127.0.0.1:1".into()),
            ..TargetOptions::default()
        }
        .resolve()?,
    };
    let client = ApiClient::new(&target);
    Ok((target, client))
}

fn label(name: &str) -> String {
    let mut v: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    v.truncate(63);
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The measurements started and not yet gathered, by method and identifier.
type Measuring = BTreeMap<(super::validate::Method, String), Active>;

impl Runner<'_> {
    async fn steps(&self, report: &mut ScenarioReport) {
        let mut active = Measuring::new();
        let run_start = Instant::now();
        for (index, step) in self.scenario.steps.iter().enumerate() {
            if self.shutdown.is_cancelled() {
                report.error.get_or_insert_with(|| {
                    format!("interrupted before step {index} ({})", step.name)
                });
                break;
            }
            let dir_name = format!("step-{index:02}-{}", crate::output::file_name(&step.name));
            let t0 = Instant::now();
            let mut sr = StepReport {
                index,
                name: step.name.clone(),
                dir: dir_name.clone(),
                started_offset_s: run_start.elapsed().as_secs_f64(),
                duration_s: 0.0,
                error: None,
                phases: Vec::new(),
                measurements_started: Vec::new(),
                gathered: Vec::new(),
                skipped: Vec::new(),
            };
            let phase_reports = match &step.body {
                StepBody::Phases(phases) => self.phases(phases, &active, &mut sr).await,
                StepBody::Measurements(ms) => {
                    self.measurements(ms, index, &mut active, &mut sr).await;
                    Vec::new()
                }
            };
            sr.duration_s = t0.elapsed().as_secs_f64();
            sr.phases = phase_reports.iter().map(|(p, _)| p.clone()).collect();
            if let Some(dir) = &self.opts.output {
                if let Err(e) = output::write_step(&dir.join(&dir_name), &sr, &phase_reports) {
                    sr.error.get_or_insert_with(|| {
                        format!("writing {}: {e}", dir.join(&dir_name).display())
                    });
                }
            }
            // What a gather found it could not measure (TestMetrics' EtcdMetrics
            // without an etcd /metrics) is listed with what the file asked for.
            for m in &sr.gathered {
                report.skipped.extend(m.skipped.iter().map(|part| {
                    format!(
                        "measurement {} `{}` gathered in step {index}: {part}",
                        m.method_as_written, m.identifier
                    )
                }));
            }
            report.measurements.extend(sr.gathered.iter().cloned());
            let failed = sr.error.clone();
            report.steps.push(sr.outline());
            if let Some(e) = failed {
                report.error = Some(format!("step {index} ({}): {e}", step.name));
                break;
            }
        }
        // Measurements the run ended before gathering still report what they saw.
        for (_, a) in std::mem::take(&mut active) {
            report.measurements.push(a.gather(None).await);
        }
        report.slos = report
            .measurements
            .iter()
            .flat_map(|m: &MeasurementResult| m.slos.clone())
            .collect();
    }

    /// A step's phases, in parallel; every active measurement counts their calls.
    async fn phases(
        &self,
        phases: &[Phase],
        active: &Measuring,
        sr: &mut StepReport,
    ) -> Vec<(PhaseReport, Option<crate::Report>)> {
        let results = futures_util::future::join_all(phases.iter().map(|p| self.phase(p))).await;
        let mut phase_reports = Vec::new();
        for (calls, pr, full) in results {
            for a in active.values() {
                a.add_calls(&calls);
            }
            if let Some(e) = &pr.error {
                sr.error
                    .get_or_insert_with(|| format!("phase {}: {e}", pr.name));
            }
            phase_reports.push((pr, full));
        }
        phase_reports
    }

    /// A step's measurement actions: start or gather each.
    async fn measurements(
        &self,
        ms: &[MeasurementAction],
        index: usize,
        active: &mut Measuring,
        sr: &mut StepReport,
    ) {
        for m in ms {
            let key = (m.method, m.identifier.clone());
            match m.action {
                Action::Run => {
                    if let Err(e) = self.run_once(m, sr).await {
                        sr.error.get_or_insert(e);
                    }
                }
                // CL2: starting a running WaitForControlledPodsRunning does nothing.
                Action::Start if active.contains_key(&key) => {}
                Action::Start => {
                    let ctx = MeasureCtx {
                        target: &self.target,
                        target_options: &self.opts.target,
                        server_metrics: &self.opts.server_metrics,
                        send: &self.opts.send,
                    };
                    match Active::start(m, index, &ctx) {
                        Ok(a) => {
                            active.insert(key, a);
                            sr.measurements_started.push(format!(
                                "{}/{}",
                                measure::method_name(m.method),
                                m.identifier
                            ));
                        }
                        Err(e) => {
                            sr.error.get_or_insert(e);
                        }
                    }
                }
                // CL2 gathers it after every phase that changes controllers: it stays started.
                Action::Gather if m.method == Method::WaitForControlledPodsRunning => {
                    if let Some(a) = active.get_mut(&key) {
                        if let Err(e) = a.wait_controlled(&self.client).await {
                            sr.error.get_or_insert(e);
                        }
                    }
                }
                Action::Gather => {
                    if let Some(a) = active.remove(&key) {
                        let r = a.gather(Some((m, index))).await;
                        sr.skipped.extend(r.skipped.iter().map(|part| {
                            format!("{} `{}`: {part}", m.method_as_written, m.identifier)
                        }));
                        sr.gathered.push(r);
                    }
                }
            }
        }
        // Watches measure what comes after their start: wait (bounded)
        // until they have listed and are watching.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !active.values().all(Active::watching) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A one-shot measurement: Sleep, WaitForRunningPods, or one loadgen skips
    /// (said once per run, at the start, and listed in the summary).
    async fn run_once(&self, m: &MeasurementAction, sr: &mut StepReport) -> Result<(), String> {
        match m.method {
            Method::Sleep => {
                let d = m.cl2.duration.unwrap_or_default();
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = self.shutdown.cancelled() => {}
                }
                Ok(())
            }
            Method::WaitForRunningPods => {
                let desired = m.cl2.desired_pod_count.unwrap_or(0);
                // CL2's default timeout.
                let timeout = m.cl2.timeout.unwrap_or(Duration::from_secs(3600));
                let (n, in_time) = super::pods::wait_running(
                    &self.client,
                    m.cl2.label_selector.as_deref(),
                    m.cl2.namespace.as_deref(),
                    desired,
                    timeout,
                )
                .await?;
                sr.measurements_started.push(format!(
                    "WaitForRunningPods/{}: {n} of {desired} running",
                    m.identifier
                ));
                if in_time {
                    Ok(())
                } else {
                    Err(format!(
                        "WaitForRunningPods `{}`: {n} of {desired} pods running after {timeout:?}",
                        m.identifier
                    ))
                }
            }
            _ => {
                sr.skipped.push(format!(
                    "{} `{}` ({})",
                    m.method_as_written,
                    m.identifier,
                    if m.action_as_written.is_empty() {
                        "-"
                    } else {
                        &m.action_as_written
                    }
                ));
                Ok(())
            }
        }
    }

    /// One phase: its calls (for measurements), its report and, for a loadgen
    /// or etcd phase, that run's full report.
    async fn phase(&self, phase: &Phase) -> (Arc<ApiCalls>, PhaseReport, Option<crate::Report>) {
        let calls = Arc::new(ApiCalls::default());
        let t0 = Instant::now();
        let mut pr = PhaseReport {
            name: phase.name.clone(),
            kind: String::new(),
            duration_s: 0.0,
            error: None,
            objects: None,
            calls: Vec::new(),
        };
        let mut full = None;
        let stop = self.shutdown.child_token();
        match &phase.kind {
            PhaseKind::Objects(o) => {
                pr.kind = "objects".into();
                let ctx = ReconcileCtx {
                    client: &self.client,
                    send: &self.opts.send,
                    scenario: &label(&self.scenario.name),
                    params: &self.scenario.params,
                    seed: self.opts.seed,
                    calls: &calls,
                };
                // After a signal, the units under way get the drain timeout.
                let drained = async {
                    stop.cancelled().await;
                    tokio::time::sleep(self.opts.drain_timeout).await;
                };
                let tally = tokio::select! {
                    t = reconcile::reconcile_until(o, &self.live, &ctx, &stop) => Some(t),
                    _ = drained => None,
                };
                match tally {
                    Some(t) if stop.is_cancelled() => {
                        pr.error = Some("interrupted".into());
                        pr.objects = Some(t);
                    }
                    Some(t) => {
                        if t.failed > 0 {
                            pr.error = Some(format!(
                                "{} of {} object operations failed; first: {}",
                                t.failed,
                                t.failed + t.created + t.updated + t.deleted,
                                t.first_error.clone().unwrap_or_default()
                            ));
                        }
                        pr.objects = Some(t);
                    }
                    None => pr.error = Some("interrupted".into()),
                }
            }
            PhaseKind::Load(config) => {
                pr.kind = "loadgen".into();
                let mut config = (**config).clone();
                config.target = self.opts.target.clone();
                config.output = None;
                config.progress = false;
                config.drain_timeout = config.drain_timeout.min(self.opts.drain_timeout);
                match crate::run(config, stop).await {
                    Ok(r) => {
                        calls.add_report(&r);
                        full = Some(r);
                    }
                    Err(e) => pr.error = Some(error_chain(&e)),
                }
            }
            PhaseKind::Etcd(args) => {
                pr.kind = "etcd".into();
                match super::etcd_phase::run(args, self.opts.etcd_endpoints.as_deref(), stop).await
                {
                    Ok(r) => {
                        calls.add_report(&r);
                        full = Some(r);
                    }
                    Err(e) => pr.error = Some(e),
                }
            }
        }
        pr.duration_s = t0.elapsed().as_secs_f64();
        pr.calls = calls.summaries();
        (calls, pr, full)
    }

    /// Deletes what the run created: cluster-scoped objects, then namespaces.
    async fn cleanup(&self, created: &[String]) -> CleanupReport {
        let mut c = CleanupReport::default();
        for (resource, name) in self.live.cluster_scoped() {
            match namespaces::delete_object(&self.client, &resource, &name).await {
                Ok(()) => c.objects_deleted += 1,
                Err(e) => c.errors.push(e),
            }
        }
        for ns in created {
            match namespaces::delete(&self.client, ns).await {
                Ok(()) => c.namespaces_deleted.push(ns.clone()),
                Err(e) => c.errors.push(e),
            }
        }
        c
    }
}
