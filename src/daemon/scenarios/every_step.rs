//! Each change the daemon makes, with each of its kernel steps made to
//! fail in turn: what it made is undone, nothing is left, and the daemon's
//! state is what it was before (issue 49, "Kill at every step"). A change
//! whose failed step is one the daemon goes on without (it says so in its
//! log) must end as the same change does when nothing fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::datapath::Datapath;

/// What the host and the daemon hold, to compare before and after.
#[derive(Debug, PartialEq)]
struct Snapshot {
    links: Vec<String>,
    guarded: Option<Vec<String>>,
    firewall: Option<String>,
    forwarding: (bool, bool),
    /// Each interface: its id, forwards and policy.
    interfaces: Vec<String>,
    leases: Vec<String>,
    networks: Vec<String>,
}

fn snapshot(s: &Scene) -> Snapshot {
    let leases = s
        .daemon
        .networks
        .iter()
        .filter_map(|(name, net)| Some((name, net.leases()?)))
        .flat_map(|(name, leases)| {
            let table = leases.lock().expect("lease lock");
            table
                .leases()
                .map(|l| format!("{name}: {} {:?}", l.ip, l.owner))
                .collect::<Vec<_>>()
        })
        .collect();
    Snapshot {
        links: s.linnet_links(),
        guarded: s.fake.guarded(),
        firewall: s.fake.firewall().map(|f| format!("{f:?}")),
        forwarding: (s.fake.forwarding(false), s.fake.forwarding(true)),
        interfaces: (s.daemon.interfaces.iter())
            .map(|(id, i)| format!("{id} {:?} {:?}", i.forwards, i.policy))
            .collect(),
        leases,
        networks: s.daemon.networks.keys().cloned().collect(),
    }
}

type Setup = fn(&mut Scene) -> futures::future::BoxFuture<'_, ()>;
type Change = fn(&mut Scene) -> futures::future::BoxFuture<'_, Result<(), DaemonError>>;

/// A change: its name, the networks, what comes before it, itself, and
/// whether it goes forward when a step fails. One that is refused (an
/// attach, a forward, a policy) leaves the state as it was; one that
/// cannot be (a detach: its VM is gone, or going) ends as it ends when
/// nothing fails once the daemon has tidied up (`tidy`), whatever it
/// answered.
struct Case {
    name: &'static str,
    yaml: &'static str,
    setup: Setup,
    change: Change,
    forward: bool,
}

fn nothing(_: &mut Scene) -> futures::future::BoxFuture<'_, ()> {
    Box::pin(async {})
}

/// An attach (by root, whom every network allows) whose fd is kept:
/// dropped, it would be a VMM gone. Leaked, so the interface stays.
async fn attach_kept(s: &mut Scene, req: AttachRequest) -> Result<(), DaemonError> {
    let attached = s.attach(&user(0, 1), req).await?;
    std::mem::forget(attached.fd);
    Ok(())
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "the first attach, which brings its network up",
            yaml: USERS,
            setup: nothing,
            change: |s| Box::pin(attach_kept(s, request(1))),
            forward: false,
        },
        Case {
            name: "an attach on a network that is up",
            yaml: USERS,
            setup: |s| Box::pin(async { attach_kept(s, request(1)).await.unwrap() }),
            change: |s| Box::pin(attach_kept(s, request(2))),
            forward: false,
        },
        Case {
            name: "an attach whose VMM opens its TAP by name",
            yaml: USERS,
            setup: nothing,
            change: |s| {
                Box::pin(attach_kept(
                    s,
                    AttachRequest {
                        datapath: Some(Datapath::TapName),
                        ..request(1)
                    },
                ))
            },
            forward: false,
        },
        Case {
            name: "an attach with a policy and a published port",
            yaml: USERS,
            setup: nothing,
            change: |s| {
                Box::pin(attach_kept(
                    s,
                    AttachRequest {
                        publish: vec!["18080:80".parse().unwrap()],
                        policy: Some(egress(&["10.0.0.0/8"], Some("20mbit"))),
                        ..request(1)
                    },
                ))
            },
            forward: false,
        },
        Case {
            name: "an attach on a bridged network (a macvtap)",
            yaml: BRIDGED,
            setup: nothing,
            change: |s| Box::pin(attach_kept(s, on("lan", 1))),
            forward: false,
        },
        Case {
            name: "an attach on a network across hosts",
            yaml: ACROSS_HOSTS,
            setup: nothing,
            change: |s| Box::pin(attach_kept(s, on("fabric", 1))),
            forward: false,
        },
        Case {
            name: "a port published on an attached VM",
            yaml: USERS,
            setup: web,
            change: |s| {
                Box::pin(async {
                    let forward = crate::api::ForwardRequest {
                        network: "shared".into(),
                        interface_id: None,
                        name: Some("web".into()),
                        forward: "18081:80".parse().unwrap(),
                    };
                    s.daemon.handle_forward_add(&user(0, 1), forward)
                })
            },
            forward: false,
        },
        Case {
            name: "a policy set on an attached VM",
            yaml: USERS,
            setup: web,
            change: |s| {
                Box::pin(async {
                    let set = crate::api::PolicySetRequest {
                        network: "shared".into(),
                        interface_id: None,
                        name: Some("web".into()),
                        policy: egress(&["10.0.0.0/8"], Some("20mbit")),
                        only: None,
                    };
                    s.daemon.policy_set(&user(0, 1), set).map(drop)
                })
            },
            forward: false,
        },
        Case {
            name: "a clone of a stopped VM",
            yaml: USERS,
            setup: |s| {
                Box::pin(async {
                    let web = s.attach(&user(0, 1), named(1, "web")).await.unwrap();
                    s.daemon.handle_detach(&user(0, 1), id(1)).await.unwrap();
                    drop(web.fd);
                })
            },
            change: |s| {
                Box::pin(attach_kept(
                    s,
                    AttachRequest {
                        clone_of: Some(CloneOf::Name("web".into())),
                        ..request(3)
                    },
                ))
            },
            forward: false,
        },
        Case {
            name: "the last detach, which takes its network down",
            yaml: USERS,
            setup: web,
            change: |s| Box::pin(async move { s.daemon.handle_detach(&user(0, 1), id(1)).await }),
            forward: true,
        },
        Case {
            name: "a detach of one VM of two",
            yaml: USERS,
            setup: |s| {
                Box::pin(async {
                    attach_kept(s, request(1)).await.unwrap();
                    attach_kept(s, request(2)).await.unwrap();
                })
            },
            change: |s| Box::pin(async move { s.daemon.handle_detach(&user(0, 1), id(2)).await }),
            forward: true,
        },
        Case {
            name: "a detach of a VM with a policy and a published port",
            yaml: USERS,
            setup: |s| {
                Box::pin(async {
                    attach_kept(s, request(1)).await.unwrap();
                    let req = AttachRequest {
                        publish: vec!["18080:80".parse().unwrap()],
                        policy: Some(egress(&["10.0.0.0/8"], Some("20mbit"))),
                        ..request(2)
                    };
                    attach_kept(s, req).await.unwrap();
                })
            },
            change: |s| Box::pin(async move { s.daemon.handle_detach(&user(0, 1), id(2)).await }),
            forward: true,
        },
        Case {
            name: "the detach of a macvtap on a bridged network",
            yaml: BRIDGED,
            setup: |s| Box::pin(async { attach_kept(s, on("lan", 1)).await.unwrap() }),
            change: |s| Box::pin(async move { s.daemon.handle_detach(&user(0, 1), id(1)).await }),
            forward: true,
        },
        Case {
            name: "a client gone with two VMs",
            yaml: USERS,
            setup: |s| {
                Box::pin(async {
                    attach_kept(s, request(1)).await.unwrap();
                    attach_kept(s, request(2)).await.unwrap();
                })
            },
            change: |s| {
                Box::pin(async {
                    let teardown = s.daemon.client_going(1);
                    s.daemon.run_teardown(teardown).await
                })
            },
            forward: true,
        },
    ]
}

/// A VM called web, attached.
fn web(s: &mut Scene) -> futures::future::BoxFuture<'_, ()> {
    Box::pin(async { attach_kept(s, named(1, "web")).await.unwrap() })
}

#[tokio::test]
async fn a_failure_at_any_step_of_a_change_leaves_nothing_and_the_state_as_it_was() {
    for case in cases() {
        // The change's steps, when none fails.
        let mut clean = Scene::new(case.yaml).await;
        (case.setup)(&mut clean).await;
        clean.fake.clear_steps();
        (case.change)(&mut clean)
            .await
            .expect("the change, when nothing fails");
        let steps = clean.fake.steps();
        clean.daemon.tidy().await;
        assert_eq!(
            clean.fake.steps(),
            steps,
            "{}: tidying up after it does nothing",
            case.name
        );
        assert!(!steps.is_empty(), "{}: no step to fail", case.name);
        let done = snapshot(&clean);
        let mut went_on = 0;
        for (k, step) in steps.iter().enumerate() {
            let mut s = Scene::new(case.yaml).await;
            (case.setup)(&mut s).await;
            let before = snapshot(&s);
            let seen = Arc::new(AtomicUsize::new(0));
            let counter = seen.clone();
            s.fake
                .fail_on(move |_| counter.fetch_add(1, Ordering::SeqCst) == k);
            let result = (case.change)(&mut s).await;
            if case.forward {
                // Tidied up as often as it takes: each time is a tick.
                for _ in 0..3 {
                    s.daemon.tidy().await;
                }
                assert_eq!(
                    snapshot(&s),
                    done,
                    "{}: step {k} ({step:?}) failed ({result:?}), and the change, tidied up after, left this",
                    case.name
                );
                continue;
            }
            let after = snapshot(&s);
            match result {
                Err(_) => assert_eq!(
                    after, before,
                    "{}: step {k} ({step:?}) failed, and the change left this",
                    case.name
                ),
                // Gone on without: as if nothing had failed.
                Ok(()) => {
                    went_on += 1;
                    assert_eq!(
                        after, done,
                        "{}: step {k} ({step:?}) failed, and the change went on to this",
                        case.name
                    )
                }
            }
        }
        let after = match case.forward {
            true => "tidied up after".to_string(),
            false => format!("{went_on} gone on without"),
        };
        eprintln!(
            "{}: each of {} steps failed in turn ({after})",
            case.name,
            steps.len()
        );
    }
}
