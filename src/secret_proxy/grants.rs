//! What a VM may have put into its requests: its secret rules, each with
//! the value of the secret it names (the owner's for the owner's rules,
//! the network's for the network's), as the daemon resolved them. The
//! proxy terminates TLS only for a server name one of them matches, and
//! puts a secret only into a request for that name.

use hickory_proto::rr::Name;

use crate::names;
use crate::policy::SecretRule;
use crate::secrets::SecretValue;

/// One secret rule of a VM and the value of the secret it names (None:
/// not set, or removed).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Grant {
    pub rule: SecretRule,
    pub value: Option<SecretValue>,
}

/// Why a placeholder is not replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    /// No rule of the VM's lets the secret go to this host.
    NoRule,
    /// A rule does, but the secret is not set.
    NotSet,
}

impl Unusable {
    pub fn why(self, secret: &str, host: &str) -> String {
        match self {
            Unusable::NoRule => {
                format!("no secret rule of this VM lets the secret {secret} go to {host}")
            }
            Unusable::NotSet => format!("the secret {secret} is not set"),
        }
    }
}

/// A server name as patterns compare it; None when it is no DNS name.
pub fn host_name(host: &str) -> Option<Name> {
    Name::from_utf8(host).ok().map(|n| names::normalise(&n))
}

/// Whether a rule of `grants` names `host`: its connections are the ones
/// terminated.
pub fn intercepts(grants: &[Grant], host: &Name) -> bool {
    grants.iter().any(|g| g.rule.host.allows(host))
}

/// The value of `secret` for a request to `host`: the first rule naming
/// both decides.
pub fn value_for<'g>(
    grants: &'g [Grant],
    host: &Name,
    secret: &str,
) -> Result<&'g SecretValue, Unusable> {
    let grant = grants
        .iter()
        .find(|g| g.rule.secret == secret && g.rule.host.allows(host))
        .ok_or(Unusable::NoRule)?;
    grant.value.as_ref().ok_or(Unusable::NotSet)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(rule: &str, value: Option<&str>) -> Grant {
        Grant {
            rule: rule.parse().unwrap(),
            value: value.map(|v| SecretValue::new(v.into()).unwrap()),
        }
    }

    #[test]
    fn a_secret_goes_only_to_a_host_its_rule_names_and_only_once_set() {
        let grants = [
            grant("TOKEN@api.example", Some("s3cret")),
            grant("KEY@*.registry.example", None),
        ];
        let host = |h: &str| host_name(h).unwrap();
        assert!(intercepts(&grants, &host("API.example.")));
        assert!(intercepts(&grants, &host("a.registry.example")));
        assert!(!intercepts(&grants, &host("registry.example")));
        assert!(!intercepts(&grants, &host("other.example")));
        let got = value_for(&grants, &host("api.example"), "TOKEN").unwrap();
        assert_eq!(got.expose(), "s3cret");
        assert_eq!(
            value_for(&grants, &host("other.example"), "TOKEN"),
            Err(Unusable::NoRule)
        );
        assert_eq!(
            value_for(&grants, &host("api.example"), "KEY"),
            Err(Unusable::NoRule),
            "KEY's rule is for the registry"
        );
        assert_eq!(
            value_for(&grants, &host("x.registry.example"), "KEY"),
            Err(Unusable::NotSet)
        );
        assert_eq!(
            Unusable::NoRule.why("KEY", "api.example"),
            "no secret rule of this VM lets the secret KEY go to api.example"
        );
    }
}
