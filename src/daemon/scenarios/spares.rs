//! Spare ports (`daemon::spares`): made on the bridge and down, taken by
//! the attaches they fit, given to the VM's user and guarded before they
//! come up; gone with their network.

use super::*;

/// The spares on `fake`: links marked as spares of `network`.
fn spares(fake: &FakeHost, network: &str) -> Vec<crate::host::netlink::Link> {
    let alias = format!("{}{network}", host::ALIAS_SPARE);
    (linnet_links(fake).iter())
        .filter_map(|name| fake.link(name))
        .filter(|l| l.alias.as_deref() == Some(alias.as_str()))
        .collect()
}

#[tokio::test]
async fn an_attach_takes_a_spare_made_on_the_bridge_and_guards_it_before_it_comes_up() {
    let mut s = Scene::new(USERS).await;
    let first = s.attach(&user(1000, 1), request(1)).await.unwrap();
    s.daemon.make_spares().await.unwrap();
    let bridge = s.fake.link("ln-shared").expect("the network's bridge");
    let made = spares(&s.fake, "shared");
    assert_eq!(made.len(), crate::daemon::drivers::SPARES, "{made:?}");
    for spare in &made {
        assert_eq!(spare.master, Some(bridge.index), "on the bridge");
        assert!(!s.fake.is_up(&spare.name), "down until an attach takes it");
        assert_ne!(spare.name, first.info.tap);
    }
    assert_eq!(s.fake.guarded(), Some(vec![first.info.tap.clone()]));

    s.fake.clear_steps();
    let second = s.attach(&user(1001, 2), request(2)).await.unwrap();
    let tap = &second.info.tap;
    assert!(made.iter().any(|m| m.name == *tap), "took a spare: {tap}");
    let steps = s.fake.steps();
    assert!(
        !steps.iter().any(|st| matches!(st, Step::CreateTap(_))),
        "{steps:#?}"
    );
    let given = position(&steps, |st| *st == Step::GiveTap(tap.clone(), 1001, 1001));
    let guarded = position(&steps, |st| *st == Step::AddGuardPort(tap.clone()));
    let up = position(
        &steps,
        |st| matches!(st, Step::Configure { link, up: true, .. } if link == tap),
    );
    assert!(given < guarded && guarded < up, "{steps:#?}");
    assert!(s.fake.is_up(tap));
    let link = s.fake.link(tap).unwrap();
    assert_eq!(link.alias, Some(format!("linnet:interface:{}", id(2))));
    assert_eq!(
        spares(&s.fake, "shared").len(),
        1,
        "one left until more are made"
    );

    // A spare deleted by hand is passed over; more than one queue is never
    // a spare; both make TAPs of their own.
    s.fake.remove_link(&spares(&s.fake, "shared")[0].name);
    let third = s.attach(&user(1000, 3), request(3)).await.unwrap();
    assert!(
        s.fake
            .link(&third.info.tap)
            .is_some_and(|l| l.master == Some(bridge.index))
    );
    s.daemon.make_spares().await.unwrap();
    let four = AttachRequest {
        queues: Some(2),
        ..request(4)
    };
    let fourth = s.attach(&user(1000, 4), four).await.unwrap();
    assert!(!made.iter().any(|m| m.name == fourth.info.tap));
    assert_eq!(
        spares(&s.fake, "shared").len(),
        2,
        "untouched by a 2-queue attach"
    );

    // An attach that fails after taking one leaves nothing of it.
    let taken = spares(&s.fake, "shared");
    s.refused_when(
        |st| matches!(st, Step::AddGuardPort(_)),
        &user(1000, 5),
        request(5),
    )
    .await;
    let left: Vec<String> = spares(&s.fake, "shared")
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    let lost: Vec<_> = taken.iter().filter(|t| !left.contains(&t.name)).collect();
    assert_eq!(lost.len(), 1);
    assert!(
        s.fake.link(&lost[0].name).is_none(),
        "its TAP went with its fd"
    );

    // The network's spares go when it does.
    for vm in [first, second, third, fourth] {
        drop(vm.fd);
    }
    for c in [1, 2, 3, 4] {
        s.client_gone(c).await;
    }
    s.daemon.stop().await;
    s.assert_nothing_left();
}

#[tokio::test]
async fn no_spare_is_taken_while_guarded_ports_are_held() {
    let mut s = Scene::new(USERS).await;
    let first = s.attach(&user(1000, 1), request(1)).await.unwrap();
    s.daemon.make_spares().await.unwrap();
    s.daemon.guard.set_held(true);
    let second = s.attach(&user(1000, 2), request(2)).await.unwrap();
    let link = s.fake.link(&second.info.tap).unwrap();
    assert_eq!(link.master, None, "waits off its bridge");
    assert_eq!(spares(&s.fake, "shared").len(), 2, "no spare taken");
    drop((first, second));
}

#[tokio::test]
async fn a_bridge_of_someone_elses_gets_no_spares() {
    let yaml = "networks:\n  lab:\n    mode: bridge\n    bridge: br0\n";
    let mut s = Scene::with_bridge(yaml, "br0").await;
    let vm = s.attach(&user(0, 1), on("lab", 1)).await.unwrap();
    s.daemon.make_spares().await.unwrap();
    assert!(spares(&s.fake, "lab").is_empty());
    let ports: Vec<String> = (linnet_links(&s.fake).into_iter())
        .filter(|l| l.starts_with(host::TAP_PREFIX))
        .collect();
    assert_eq!(ports, vec![vm.info.tap.clone()], "the VM's alone");
}
