//! Identities: tokens, client certificates and anonymous, as the simulator sees them.

use super::*;

pub(crate) fn identities(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let inputs = tempfile::tempdir()?;
    let tokens = inputs.path().join("tokens.csv");
    std::fs::write(
        &tokens,
        "alice-token,alice,uid-alice,\"dev,ops\"\nbob-token,bob,uid-bob\n",
    )?;
    let client_ca = CertAuthority::generate("e2e-client-ca")?;
    let client_ca_file = inputs.path().join("client-ca.crt");
    std::fs::write(&client_ca_file, client_ca.cert_pem())?;
    let tokens_arg = tokens.to_string_lossy();
    let ca_arg = client_ca_file.to_string_lossy();
    let mut args = vec!["--token-auth-file", &*tokens_arg];
    if scheme == Scheme::Tls {
        args.extend(["--client-ca-file", &*ca_arg]);
    }
    let sim = seeded(scheme, store, &args)?;
    let alice = sim.kubectl_as("alice", &KubeUser::Token("alice-token".into()))?;
    let wrong = sim.kubectl_as("wrong", &KubeUser::Token("not-a-token".into()))?;

    // No credentials at all: anonymous.
    let (user, _, groups) = whoami(&sim.kubectl())?;
    assert_eq!(user, "system:anonymous");
    assert_eq!(groups, ["system:unauthenticated"]);

    if scheme == Scheme::Http {
        // kubectl (client-go's clientcmd) loads a kubeconfig user's credentials only for TLS
        // transports: over plain HTTP it sends no token, so every caller is anonymous, even
        // with a wrong token. Tests that need identities over kubectl must use --tls.
        for k in [&alice, &wrong] {
            let (user, _, _) = whoami(k)?;
            assert_eq!(user, "system:anonymous", "{}", k.kubeconfig.display());
        }
        return still_running(sim);
    }

    let (user, uid, groups) = whoami(&alice)?;
    assert_eq!(user, "alice");
    assert_eq!(uid, "uid-alice");
    assert_eq!(groups, ["dev", "ops", "system:authenticated"]);
    // The token works for ordinary requests too.
    assert_eq!(
        alice.ok(&["get", "nodes", "--no-headers"])?.lines().count(),
        NODES
    );

    let bob = sim.kubectl_as("bob", &KubeUser::Token("bob-token".into()))?;
    assert_eq!(
        whoami(&bob)?,
        (
            "bob".into(),
            "uid-bob".into(),
            vec!["system:authenticated".into()]
        )
    );

    // A token the server does not know is refused (401), not served as anonymous.
    let err = wrong.fails(&["auth", "whoami", "-o", "json"])?;
    assert!(
        err.contains("You must be logged in to the server (Unauthorized)"),
        "{err}"
    );
    // (`get` fails in discovery, where client-go words a 401 differently.)
    let err = wrong.fails(&["get", "nodes"])?;
    assert!(err.contains("You must be logged in to the server"), "{err}");

    // Client certificates: CN is the user, O the groups.
    let cert = client_ca.issue_client("carol", &["team-a", "team-b"])?;
    let carol = sim.kubectl_as(
        "carol",
        &KubeUser::ClientCert {
            cert_pem: cert.cert_pem.clone(),
            key_pem: cert.key_pem.clone(),
        },
    )?;
    let (user, _, groups) = whoami(&carol)?;
    assert_eq!(user, "carol");
    assert_eq!(groups, ["team-a", "team-b", "system:authenticated"]);
    assert_eq!(
        carol.ok(&["get", "nodes", "--no-headers"])?.lines().count(),
        NODES
    );

    // A certificate from a CA the server does not trust never authenticates its CN.
    let other_ca = CertAuthority::generate("not-the-client-ca")?;
    let forged = other_ca.issue_client("carol", &["system:masters"])?;
    let mallory = sim.kubectl_as(
        "mallory",
        &KubeUser::ClientCert {
            cert_pem: forged.cert_pem,
            key_pem: forged.key_pem,
        },
    )?;
    let r = mallory.run(&["auth", "whoami", "-o", "json"])?;
    assert!(
        !r.success(),
        "an untrusted client certificate was accepted: {}",
        r.stdout
    );
    // As kube-apiserver: the handshake succeeds and the request is refused with 401.
    assert!(r.stderr.contains("Unauthorized"), "{}", r.stderr);
    still_running(sim)
}
