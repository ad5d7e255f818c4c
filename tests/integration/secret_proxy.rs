//! Secrets put into a guest's HTTPS requests by the network's secrets
//! proxy (issue 51; docs/secrets.md). The world: nginx in the upstream's
//! namespace serving `api.secret.test` and `other.secret.test` on one
//! address under a CA the host trusts (the daemon's SSL_CERT_FILE), and
//! `forged.secret.test` on another under a CA no one trusts; it logs the
//! headers each request brought and answers with a fixed page, never
//! echoing them. The guest asks linnet's DNS for the names (so they are
//! learned, as a real guest's resolver would), then uses curl.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

const SHARED: &str = "198.51.100.6";
const FORGED: &str = "198.51.100.7";
const VALUE: &str = "tok_Sup3rSecretValue0001";
const ROTATED: &str = "tok_Sup3rSecretValue0002";
const PLACEHOLDER: &str = "Bearer {{secret:TOKEN}}";

/// A CA made with rcgen, and a leaf of it for `names`: (ca.pem,
/// leaf.pem, leaf.key).
fn ca_and_leaf(names: &[&str], cn: &str) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, cn.to_string());
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    (ca_cert.pem(), leaf.pem(), leaf_key.serialize_pem())
}

struct Upstream {
    _nginx: Reaped,
    log: PathBuf,
    /// The host's trust store: the CA that signed the shared address's
    /// names among many.
    trusted: PathBuf,
}

impl Upstream {
    /// The requests nginx logged: `host|authorization|x-api-key|uri|protocol`.
    fn seen(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// nginx in the upstream's namespace, one process, logging headers.
fn upstream(world: &World) -> Upstream {
    let dir = world.dir.path().join("nginx");
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    for ip in [SHARED, FORGED] {
        must(
            &mut world
                .upstream
                .cmd(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]),
        );
    }
    let (ca, cert, key) = ca_and_leaf(
        &["api.secret.test", "other.secret.test"],
        "test upstream CA",
    );
    let (_, forged_cert, forged_key) = ca_and_leaf(&["forged.secret.test"], "nobody's CA");
    // As large as a distribution's bundle (Debian's: ~140 CAs, 220 KB),
    // more than a socket takes at once by default: 600 CAs and the
    // upstream's among them.
    let mut bundle = String::new();
    for i in 0..600 {
        if i == 300 {
            bundle += &ca;
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let mut other = rcgen::CertificateParams::default();
        other.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        (other.distinguished_name).push(rcgen::DnType::CommonName, format!("another CA {i}"));
        bundle += &other.self_signed(&key).unwrap().pem();
    }
    assert!(bundle.len() > 256 << 10, "{}", bundle.len());
    let trusted = write(&dir, "trusted.pem", &bundle);
    let pem = |name: &str, text: &str| write(&dir, name, text).display().to_string();
    let (cert, key) = (pem("up.pem", &cert), pem("up.key", &key));
    let (forged_cert, forged_key) = (
        pem("forged.pem", &forged_cert),
        pem("forged.key", &forged_key),
    );
    let log = dir.join("headers.log");
    let d = dir.display();
    let conf = format!(
        r#"master_process off;
daemon off;
user root;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{}}
http {{
    client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
    uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
    log_format headers '$http_host|$http_authorization|$http_x_api_key|$request_uri|$server_protocol';
    access_log {log} headers;
    server {{
        listen {SHARED}:443 ssl http2;
        listen {SHARED}:80;
        server_name api.secret.test other.secret.test;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{ return 200 "hello from upstream\n"; }}
    }}
    server {{
        listen {FORGED}:443 ssl http2;
        server_name forged.secret.test;
        ssl_certificate {forged_cert};
        ssl_certificate_key {forged_key};
        location / {{ return 200 "hello from a forger\n"; }}
    }}
}}
"#,
        log = log.display()
    );
    let conf = write(&dir, "nginx.conf", &conf);
    let conf = conf.to_str().unwrap();
    let nginx = Reaped(
        world
            .upstream
            .cmd(&["nginx", "-c", conf])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("nginx to listen", Duration::from_secs(10), || {
        let out = must(&mut world.upstream.cmd(&["ss", "-Hltn"]));
        (out.contains(&format!("{SHARED}:443")) && out.contains(&format!("{FORGED}:443")))
            .then_some(())
    });
    Upstream {
        _nginx: nginx,
        log,
        trusted,
    }
}

/// curl in the guest, for `url` at `address`, trusting `ca` (None: the
/// system's), with `args`; (exit code, body and headers said).
fn curl(g: &Guest, address: &str, url: &str, ca: Option<&Path>, args: &[&str]) -> (i32, String) {
    let host = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split(['/', ':']).next())
        .unwrap();
    let port = if url.starts_with("https") { 443 } else { 80 };
    let resolve = format!("{host}:{port}:{address}");
    let mut argv = vec![
        "curl",
        "-sS",
        "-g",
        "--max-time",
        "10",
        "--resolve",
        &resolve,
    ];
    let ca = ca.map(|p| p.display().to_string());
    if let Some(ca) = &ca {
        argv.extend_from_slice(&["--cacert", ca]);
    }
    argv.extend_from_slice(args);
    argv.push(url);
    let out = run(&mut g.ns.cmd(&argv));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), said)
}

fn bearer(g: &Guest, url: &str, ca: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["-H", "Authorization: Bearer {{secret:TOKEN}}"];
    args.extend_from_slice(extra);
    curl(g, SHARED, url, Some(ca), &args)
}

fn set_secret(world: &World, who: &[&str], value: &str) {
    let mut cmd = world.linnet_wrapped(who, &["secret", "set", "TOKEN"]);
    let mut child = cmd.stdin(std::process::Stdio::piped()).spawn().unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(value.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_secret_goes_into_the_guests_https_requests_to_its_host_alone_and_nowhere_else() {
    let keep = tempfile::tempdir().unwrap();
    let audit = keep.path().join("shared.jsonl");
    let mut world = World::with_config(&format!(
        "networks:\n  shared:\n    allow: {{ users: [root, nobody] }}\n    audit_log: {}\n",
        audit.display()
    ));
    let up = upstream(&world);
    let trusted = up.trusted.display().to_string();
    world.start_daemon_with(&["env", &format!("SSL_CERT_FILE={trusted}")], &[]);
    set_secret(&world, &[], VALUE);
    let ca = write(
        world.dir.path(),
        "network-ca.pem",
        &must(&mut world.linnet(&["ca", "--network", "shared"])),
    );
    let rules = [
        "--allow-connect",
        "api.secret.test:443",
        "--allow-connect",
        "other.secret.test:443",
        "--allow-connect",
        "forged.secret.test:443",
        "--allow-connect",
        "api.secret.test:80",
        "--secret",
        "TOKEN@api.secret.test",
        "--secret",
        "TOKEN@forged.secret.test",
    ];
    let mut args = vec!["--name", "agent"];
    args.extend_from_slice(&rules);
    let g = world.guest("shared", &args);
    assert_eq!(g.udhcpc(), g.ip());
    for (name, ip) in [
        ("api.secret.test", SHARED),
        ("other.secret.test", SHARED),
        ("forged.secret.test", FORGED),
    ] {
        assert_eq!(g.lookup(name, &g.gateway()), Some(ip.into()), "{name}");
    }
    let api = "https://api.secret.test/v1/models?key={{secret:TOKEN}}";

    // HTTP/1.1 and HTTP/2 (curl negotiates h2 where it can): the upstream
    // gets the secret; the guest gets the page, never the secret.
    for version in ["--http1.1", "--http2"] {
        let (code, said) = bearer(&g, api, &ca, &[version, "-i"]);
        assert_eq!(code, 0, "{version}: {said}");
        assert!(said.contains("hello from upstream"), "{said}");
        assert!(!said.contains(VALUE), "{said}");
    }
    // Two requests on one kept-alive connection (curl reuses it for its
    // second URL): both get it.
    let (code, said) = bearer(&g, api, &ca, &["--http1.1", api]);
    assert_eq!(code, 0, "{said}");
    assert_eq!(said.matches("hello from upstream").count(), 2, "{said}");
    let seen = up.seen();
    assert_eq!(seen.len(), 4, "{seen:#?}");
    for line in &seen {
        assert!(
            line.starts_with(&format!("api.secret.test|Bearer {VALUE}|")),
            "{line}"
        );
        assert!(
            line.contains("|/v1/models?key={{secret:TOKEN}}|"),
            "the query goes as the guest wrote it: {line}"
        );
    }
    assert!(
        seen[0].ends_with("HTTP/1.1") && seen[1].ends_with("HTTP/2.0"),
        "{seen:#?}"
    );

    // Where the secret never goes, beside the control above:
    // another name at the same address (no rule): spliced, the upstream's
    // own certificate, the placeholder as written;
    let (code, said) = bearer(&g, "https://other.secret.test/", &ca, &[]);
    assert_ne!(code, 0, "the network's CA does not vouch for it: {said}");
    let (code, said) = curl(
        &g,
        SHARED,
        "https://other.secret.test/",
        Some(&up.trusted),
        &["-H", "Authorization: Bearer {{secret:TOKEN}}"],
    );
    assert_eq!(code, 0, "the upstream's own certificate: {said}");
    // a Host that is not the server name: refused, nothing sent;
    let (code, said) = bearer(
        &g,
        api,
        &ca,
        &["--http1.1", "-H", "Host: other.secret.test"],
    );
    assert_eq!(code, 0);
    assert!(
        said.contains("linnet: its host (other.secret.test) is not api.secret.test"),
        "{said}"
    );
    // plain HTTP: never steered, the placeholder as written;
    let (code, said) = curl(
        &g,
        SHARED,
        "http://api.secret.test/plain",
        None,
        &["-H", "Authorization: Bearer {{secret:TOKEN}}"],
    );
    assert_eq!(code, 0, "{said}");
    // an upstream whose certificate the host does not trust: the guest's
    // handshake is never finished, so it sends nothing.
    let (code, said) = curl(
        &g,
        FORGED,
        "https://forged.secret.test/",
        Some(&ca),
        &["-H", "Authorization: Bearer {{secret:TOKEN}}"],
    );
    assert_ne!(code, 0, "{said}");
    let seen = up.seen();
    assert_eq!(
        &seen[4..],
        [
            format!("other.secret.test|{PLACEHOLDER}|-|/|HTTP/2.0"),
            format!("api.secret.test|{PLACEHOLDER}|-|/plain|HTTP/1.1"),
        ],
        "{seen:#?}"
    );

    // A guest that does not trust the network's CA fails its handshake:
    // no silent downgrade.
    let (code, said) = curl(
        &g,
        SHARED,
        api,
        None,
        &["-H", "Authorization: Bearer {{secret:TOKEN}}"],
    );
    assert_eq!(
        code, 60,
        "curl: the peer's certificate is not trusted: {said}"
    );

    // The proxy runs confined as its own user; killed, it starts again and
    // is told all it knew (the grants, what the guest learned): the next
    // request gets the secret, without the guest asking its name again.
    let proxy = crate::gate::child_named(&world, "linnet-secrets", None);
    assert_eq!(
        proc_status(proxy, "Uid").split_whitespace().next(),
        Some("2137784318")
    );
    assert_eq!(proc_status(proxy, "Seccomp"), "2");
    assert_eq!(proc_status(proxy, "CapEff"), "0000000000000000");
    // SAFETY: kill(2) with integer arguments.
    unsafe { libc::kill(proxy as i32, libc::SIGKILL) };
    let again = crate::gate::child_named(&world, "linnet-secrets", Some(proxy));
    assert_ne!(again, proxy);
    let (code, said) = bearer(&g, api, &ca, &[]);
    assert!(
        code == 0 && said.contains("hello from upstream"),
        "after a restart: {said}"
    );
    assert!(
        up.seen()
            .last()
            .unwrap()
            .contains(&format!("|Bearer {VALUE}|"))
    );

    // Rotation holds for the next request; removal refuses the request.
    set_secret(&world, &[], ROTATED);
    let (code, said) = bearer(&g, api, &ca, &[]);
    assert_eq!(code, 0, "{said}");
    assert!(
        up.seen()
            .last()
            .unwrap()
            .contains(&format!("|Bearer {ROTATED}|"))
    );
    must(&mut world.linnet(&["secret", "rm", "TOKEN"]));
    let before = up.seen().len();
    let (code, said) = bearer(&g, api, &ca, &[]);
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("linnet: the secret TOKEN is not set"),
        "{said}"
    );
    assert_eq!(up.seen().len(), before, "nothing sent upstream");

    // Another user's VM, with the same rule, does not get root's secret.
    set_secret(&world, &[], VALUE);
    // (`linnet attach` for nobody, whose VMM opens the TAP by name.)
    let mut args = vec!["attach", "--name", "theirs", "--user", "nobody"];
    args.extend_from_slice(&rules);
    let info: Value = serde_json::from_str(must(&mut world.linnet(&args)).trim()).unwrap();
    let theirs = crate::tap_name::guest_of_nobody(&world, &info);
    assert_eq!(theirs.udhcpc(), theirs.ip());
    assert_eq!(
        theirs.lookup("api.secret.test", &theirs.gateway()),
        Some(SHARED.into())
    );
    let (code, said) = bearer(&theirs, api, &ca, &[]);
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("linnet: the secret TOKEN is not set"),
        "{said}"
    );
    let (code, said) = bearer(&g, api, &ca, &[]);
    assert!(
        code == 0 && said.contains("hello from upstream"),
        "root's own, the control: {said}"
    );

    // What the proxies' uid may send: HTTPS to other machines (the
    // control), not another port, nor the host's own addresses.
    let (uid, gid) = (
        format!("--reuid={}", 0x7f6b_fffe_u32),
        format!("--regid={}", 0x7f6b_fffe_u32),
    );
    let curl_as = |who: &[&str], url: &str, resolve: &str| {
        let mut argv = who.to_vec();
        argv.extend_from_slice(&[
            "curl",
            "-sS",
            "-k",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--resolve",
            resolve,
            url,
        ]);
        let out = run(&mut world.host.cmd(&argv));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let proxy_uid = ["setpriv", uid.as_str(), gid.as_str(), "--clear-groups"];
    let as_proxy = |url: &str, resolve: &str| curl_as(&proxy_uid, url, resolve);
    let upstream = format!("api.secret.test:443:{SHARED}");
    assert_eq!(
        as_proxy("https://api.secret.test/", &upstream),
        (Some(0), "200".into()),
        "HTTPS out, the control"
    );
    let plain = format!("api.secret.test:80:{SHARED}");
    assert_eq!(
        curl_as(&[], "http://api.secret.test/", &plain),
        (Some(0), "200".into()),
        "port 80 answers root"
    );
    let (code, _) = as_proxy("http://api.secret.test/", &plain);
    assert_eq!(code, Some(7), "another port: refused");
    // linnet's DNS on the gateway answers TCP: root's curl connects (and
    // gets no HTTP), the proxies' uid is refused.
    let gateway = format!("gw.test:53:{}", g.gateway());
    let (code, _) = curl_as(&[], "http://gw.test:53/", &gateway);
    assert!(code != Some(7) && code.is_some(), "root connects: {code:?}");
    let (code, _) = as_proxy("http://gw.test:53/", &gateway);
    assert_eq!(code, Some(7), "the host's own address: refused");

    // The value is nowhere but upstream: not in the daemon's log, its
    // events (the audit file), ls, policy show, secret ls.
    let audit_text = std::fs::read_to_string(&audit).unwrap();
    let records: Vec<Value> = audit_text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let substituted = records
        .iter()
        .filter(|r| r["event"] == "secret" && r["substituted"] == true)
        .count();
    assert!(substituted >= 5, "{audit_text}");
    assert!(records.iter().any(|r| r["event"] == "secret"
        && r["substituted"] == false
        && r["why"].as_str().is_some_and(|w| w.contains("is not set"))));
    assert!(records.iter().any(|r| r["event"] == "connection"
        && r["decrypted"] == true
        && r["shown"] == "api.secret.test"));
    assert!(records.iter().any(|r| r["event"] == "connection"
        && r["allowed"] == false
        && r["shown"] == "forged.secret.test"));
    let shown = [
        world.daemon_log_text(),
        audit_text,
        must(&mut world.linnet(&["ls", "--json"])),
        must(&mut world.linnet(&["policy", "show", "--name", "agent", "--json"])),
        must(&mut world.linnet(&["secret", "ls", "--json"])),
    ];
    for text in &shown {
        assert!(!text.contains(VALUE) && !text.contains(ROTATED), "{text}");
    }
    assert!(shown[3].contains("TOKEN@api.secret.test"), "{}", shown[3]);
}
