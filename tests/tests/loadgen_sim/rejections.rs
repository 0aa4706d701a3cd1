//! The sim's max-in-flight 429s, counted and retried after Retry-After.

use super::*;

/// An HTTP answer: status, headers (lower-cased names) and body.
type Answer = (u16, Vec<(String, String)>, String);

/// One HTTP/1.1 request over a new connection, and its answer.
fn raw_get(url: &str, path: &str, token: &str) -> anyhow::Result<Answer> {
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").context("no end of headers")?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .context("no status line")?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok((status, headers, body.to_string()))
}

/// The simulator's max-in-flight filter refuses a non-admin user with 429 (plain text,
/// `Retry-After: 1`); loadgen counts each first-try 429, and with `--honor-retry-after`
/// retries after the server's Retry-After, counting retries and final 429s apart. The counts
/// match what the simulator served. `system:masters` is never refused.
///
/// The load: LISTs of 1,500 pods and GETs of one node, both at 40/s on the same ticks,
/// against `--max-requests-inflight 1`: whichever arrives second while the other is still
/// being answered is refused.
#[test]
fn counts_the_sims_429s_and_retries_after_them() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(
        &tokens,
        "admin-token,admin,1,\"system:masters\"\nuser-token,load-tester,2,\"load-testers\"\n",
    )?;
    let sim = SimProcess::start(&[
        "--token-auth-file",
        &tokens.display().to_string(),
        "--max-requests-inflight",
        "1",
        "--nodes",
        "10",
        "--pods",
        "1500",
        "--namespaces",
        "1",
    ])?;
    // kubectl sends no token over plain HTTP: it scrapes the simulator's metrics as
    // system:anonymous, only while loadgen is not running (so never refused).
    let k = sim.kubectl();
    let (who, _, _) = whoami(&k)?;
    anyhow::ensure!(who == "system:anonymous", "kubectl is served as {who}");
    // The node the GETs address (loadgen-node-0), seeded as admin.
    let seed = target_args(&sim, &["--token", "admin-token", "--nodes", "1"])?;
    let mut seed_args = vec!["seed"];
    seed_args.extend(strs(&seed));
    loadgen(&seed_args, Duration::ZERO)?;

    let load = |extra: &[&str], token: &str, out: &Path| -> anyhow::Result<Vec<String>> {
        let output = out.display().to_string();
        let mut args = vec![
            "--token",
            token,
            "--duration",
            "5s",
            "--lists",
            "40/s",
            "-A",
            "--list-rv",
            "cache",
            "--gets",
            "40/s",
            "--get-resource",
            "nodes",
            "--objects",
            "1",
            "--no-progress",
            "--output",
            &output,
        ];
        args.extend_from_slice(extra);
        target_args(&sim, &args)
    };
    // What the simulator answered to loadgen's pod LISTs and node GETs.
    let answered = |before: &RequestCounts, after: &RequestCounts, code: Option<&'static str>| {
        let mut lists = vec![("verb", "LIST"), ("resource", "pods"), ("scope", "cluster")];
        let mut gets = vec![
            ("verb", "GET"),
            ("resource", "nodes"),
            ("scope", "resource"),
        ];
        lists.extend(code.map(|c| ("code", c)));
        gets.extend(code.map(|c| ("code", c)));
        (served(before, after, &lists), served(before, after, &gets))
    };

    // 1. No retries: every first-try 429 is counted, as the simulator's plain-text body.
    let out = TempDir::new()?;
    let before = RequestCounts::scrape(&k)?;
    let run = Loadgen::spawn(&strs(&load(&[], "user-token", out.path())?))?;
    // Meanwhile: requests of our own (LISTs of namespaces), as the same user, until one is
    // refused; that 429 is what loadgen must understand.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, headers, body) = loop {
        let answer = raw_get(&sim.url, "/api/v1/namespaces", "user-token")?;
        if answer.0 == 429 || Instant::now() >= deadline {
            break answer;
        }
    };
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    anyhow::ensure!(
        status == 429
            && header("retry-after") == Some("1")
            && header("content-type").is_some_and(|c| c.starts_with("text/plain"))
            && body.contains("Too many requests, please try again later."),
        "no 429 as expected from the sim within 20 s; the last answer: {status} {headers:?}\n{body:.300}"
    );
    run.wait(Duration::from_secs(5) + LOADGEN_GRACE)?.ok()?;
    let after = RequestCounts::scrape(&k)?;
    let s = read_summary(out.path())?;
    let mut refused = 0;
    for name in ["list", "get"] {
        let o = op(&s, name)?;
        let requests = num(o, "requests");
        let rejected = code(o, "429");
        refused += rejected;
        anyhow::ensure!(
            (requests as f64 - 200.0).abs() <= 200.0 * RATE_TOLERANCE && num(o, "dropped") == 0,
            "{name}: {o:#}"
        );
        anyhow::ensure!(
            num(&o["retries"], "first_try_429") == rejected
                && num(&o["retries"], "retries") == 0
                && num(&o["rejections_429_body"], "plain_text") == rejected
                && num(&o["rejections_429_body"], "status_json") == 0
                && o["error_classes"]["429"].as_u64().unwrap_or(0) == rejected
                && num(o, "ok") + rejected == requests
                && num(o, "errors") == rejected,
            "{name}: 429 accounting: {o:#}"
        );
        let rate_429 = o["rate_429"].as_f64().unwrap_or(-1.0);
        anyhow::ensure!(
            (rate_429 - rejected as f64 / requests as f64).abs() < 1e-9,
            "{name}: rate_429 {rate_429}: {o:#}"
        );
    }
    anyhow::ensure!(refused > 0, "no 429 counted: {s:#}");
    // Our own probes asked for namespaces: the pod LISTs and node GETs are loadgen's alone.
    let (list, get) = (op(&s, "list")?, op(&s, "get")?);
    let all = answered(&before, &after, None);
    let rejected = answered(&before, &after, Some("429"));
    anyhow::ensure!(
        all == (num(list, "requests"), num(get, "requests"))
            && rejected == (code(list, "429"), code(get, "429")),
        "the simulator answered (LISTs, GETs) {all:?}, with 429 {rejected:?}; loadgen: {s:#}"
    );
    check_output_files(out.path(), &s)?;

    // 2. With --honor-retry-after: first-try 429s are retried after Retry-After (1 s).
    let out = TempDir::new()?;
    let before = RequestCounts::scrape(&k)?;
    let args = load(
        &["--honor-retry-after", "--max-retries", "5"],
        "user-token",
        out.path(),
    )?;
    loadgen(&strs(&args), Duration::from_secs(5))?;
    let after = RequestCounts::scrape(&k)?;
    let s = read_summary(out.path())?;
    let mut totals = (0, 0, 0, 0, 0);
    let mut slowest: f64 = 0.0;
    for name in ["list", "get"] {
        let o = op(&s, name)?;
        let r = &o["retries"];
        let (requests, first, retries, last) = (
            num(o, "requests"),
            num(r, "first_try_429"),
            num(r, "retries"),
            num(r, "final_429"),
        );
        anyhow::ensure!(
            (requests as f64 - 200.0).abs() <= 200.0 * RATE_TOLERANCE
                && retries >= first
                && last == code(o, "429")
                && num(o, "ok") + last == requests,
            "{name}: retry accounting: {o:#}"
        );
        totals = (
            totals.0 + requests,
            totals.1 + first,
            totals.2 + retries,
            totals.3 + last,
            totals.4 + num(o, "ok"),
        );
        slowest = slowest.max(o["latency_ms"]["max"].as_f64().unwrap_or(0.0));
    }
    let (requests, first, retries, last, _) = totals;
    anyhow::ensure!(first > 0, "no first-try 429 with retries: {s:#}");
    anyhow::ensure!(
        slowest >= 1000.0,
        "a retried request waited the 1 s Retry-After, but the slowest took {slowest} ms: {s:#}"
    );
    // Every attempt reached the simulator: one per request plus one per retry; each retry
    // followed a 429, and so did each request still refused at the end.
    let all = answered(&before, &after, None);
    let rejected = answered(&before, &after, Some("429"));
    anyhow::ensure!(
        all.0 + all.1 == requests + retries && rejected.0 + rejected.1 == retries + last,
        "the simulator answered {all:?} (LISTs, GETs), {rejected:?} with 429; loadgen: \
         {requests} requests, {retries} retries, {last} final 429s"
    );

    // 3. The same load as system:masters is never refused.
    let out = TempDir::new()?;
    loadgen(
        &strs(&load(&[], "admin-token", out.path())?),
        Duration::from_secs(5),
    )?;
    let s = read_summary(out.path())?;
    check_clean_op(&s, "list", 40.0, 5.0, "200")?;
    check_clean_op(&s, "get", 40.0, 5.0, "200")?;
    still_running(sim)
}
