//! Secrets linnet holds for VMs that use them but never hold them (issue
//! 51): each a name, whose it is (a user's, or a network's, set by root),
//! its value and when it was set. Plain data: who may set, remove and see
//! which, what a name and a value may be, and the file they are kept in.
//! A value is shown nowhere: its `Debug` and `Display` say `<secret>`,
//! and listing gives names, owners and times only.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The longest name (it travels in placeholders: `{{secret:NAME}}`).
pub const MAX_NAME: usize = 64;
/// The longest value: an HTTP header value (a token, a key, a JWT).
pub const MAX_VALUE: usize = 8192;

/// A secret's value. Never printed: `{:?}` and `{}` are `<secret>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretValue(String);

impl SecretValue {
    /// The value as given, checked: not empty, at most `MAX_VALUE` bytes,
    /// and what an HTTP header value may carry (visible characters,
    /// spaces and tabs; no CR, LF or other control characters, which would
    /// let it end the header it is put into and start another).
    pub fn new(value: String) -> Result<SecretValue, SecretError> {
        if value.is_empty() {
            return Err(SecretError::EmptyValue);
        }
        if value.len() > MAX_VALUE {
            return Err(SecretError::LongValue(value.len()));
        }
        if value.chars().any(|c| c.is_control() && c != '\t') {
            return Err(SecretError::ControlInValue);
        }
        Ok(SecretValue(value))
    }

    /// The value, for the one place that puts it into a request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

/// Whose a secret is: a user's (its VMs may use it), or a network's (set
/// by root; every VM of the network may use it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretOwner {
    Uid(u32),
    Network(String),
}

impl fmt::Display for SecretOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretOwner::Uid(uid) => write!(f, "uid {uid}"),
            SecretOwner::Network(n) => write!(f, "network \"{n}\""),
        }
    }
}

/// Checks a secret's name: 1 to `MAX_NAME` of ASCII letters, digits, `_`,
/// `-` and `.`, starting with a letter or `_` (what a placeholder can
/// carry without quoting).
pub fn check_name(name: &str) -> Result<(), SecretError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if name.len() > MAX_NAME || !first_ok || !rest_ok {
        return Err(SecretError::BadName(
            name.chars().take(MAX_NAME + 1).collect(),
        ));
    }
    Ok(())
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SecretError {
    #[error(
        "\"{0}\" is not a secret name: 1 to {MAX_NAME} letters, digits, '_', '-' or '.', starting with a letter or '_'"
    )]
    BadName(String),
    #[error("the secret's value is empty (it is read from standard input)")]
    EmptyValue,
    #[error("the secret's value is {0} bytes; at most {MAX_VALUE}")]
    LongValue(usize),
    #[error(
        "the secret's value holds a control character (a line break?): it goes into an HTTP header, which it must not end (one final newline of standard input is dropped)"
    )]
    ControlInValue,
    #[error("only root may {0} a network's secret")]
    NetworkRootOnly(&'static str),
    #[error("no secret \"{name}\" of {owner}")]
    Unknown { name: String, owner: SecretOwner },
}

/// A secret as kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret {
    pub owner: SecretOwner,
    pub name: String,
    pub value: SecretValue,
    /// When it was set, in ms since the epoch.
    pub set_at_ms: u64,
}

/// A secret as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretListed {
    pub owner: SecretOwner,
    pub name: String,
    pub set_at_ms: u64,
}

/// The secrets linnet holds, by owner and name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Store {
    secrets: BTreeMap<(SecretOwner, String), Secret>,
}

/// The file the secrets are kept in.
#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    secrets: Vec<Secret>,
}

const FILE_VERSION: u32 = 1;

impl Store {
    /// Whose a secret set or removed by `uid` is: its own, or with
    /// `network`, that network's (root only).
    pub fn owner_for(
        uid: u32,
        network: Option<&str>,
        what: &'static str,
    ) -> Result<SecretOwner, SecretError> {
        match network {
            Some(_) if uid != 0 => Err(SecretError::NetworkRootOnly(what)),
            Some(n) => Ok(SecretOwner::Network(n.into())),
            None => Ok(SecretOwner::Uid(uid)),
        }
    }

    /// Sets (or rotates) a secret; returns whether it was there before.
    pub fn set(&mut self, owner: SecretOwner, name: &str, value: SecretValue, now_ms: u64) -> bool {
        let secret = Secret {
            owner: owner.clone(),
            name: name.into(),
            value,
            set_at_ms: now_ms,
        };
        self.secrets.insert((owner, name.into()), secret).is_some()
    }

    pub fn remove(&mut self, owner: &SecretOwner, name: &str) -> Result<(), SecretError> {
        self.secrets
            .remove(&(owner.clone(), name.to_string()))
            .map(|_| ())
            .ok_or_else(|| SecretError::Unknown {
                name: name.into(),
                owner: owner.clone(),
            })
    }

    /// The value of `owner`'s secret `name`, if set.
    pub fn value(&self, owner: &SecretOwner, name: &str) -> Option<&SecretValue> {
        (self.secrets.get(&(owner.clone(), name.to_string()))).map(|s| &s.value)
    }

    /// What `uid` may see of them (names, owners, times): root all; a user
    /// its own and those of the networks `may_use` says it may attach to.
    pub fn list(&self, uid: u32, may_use: impl Fn(&str) -> bool) -> Vec<SecretListed> {
        (self.secrets.values())
            .filter(|s| match &s.owner {
                SecretOwner::Uid(owner) => uid == 0 || *owner == uid,
                SecretOwner::Network(n) => uid == 0 || may_use(n),
            })
            .map(|s| SecretListed {
                owner: s.owner.clone(),
                name: s.name.clone(),
                set_at_ms: s.set_at_ms,
            })
            .collect()
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let file = File {
            version: FILE_VERSION,
            secrets: self.secrets.values().cloned().collect(),
        };
        serde_json::to_vec_pretty(&file).expect("secrets serialize")
    }

    /// The store a file holds. A secret whose name or value no longer
    /// passes the checks is left out, named in what comes back.
    pub fn from_bytes(bytes: &[u8]) -> Result<(Store, Vec<String>), String> {
        let file: File = serde_json::from_slice(bytes).map_err(|e| {
            // serde's message may quote what it read: only where.
            format!(
                "not a secrets file (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        if file.version != FILE_VERSION {
            return Err(format!(
                "a secrets file of version {}, this linnet reads {FILE_VERSION}",
                file.version
            ));
        }
        let mut store = Store::default();
        let mut dropped = Vec::new();
        for s in file.secrets {
            let ok = check_name(&s.name).is_ok()
                && SecretValue::new(s.value.expose().to_string()).is_ok();
            if ok {
                store.secrets.insert((s.owner.clone(), s.name.clone()), s);
            } else {
                dropped.push(format!("{} of {}", s.name, s.owner));
            }
        }
        Ok((store, dropped))
    }
}

/// What standard input gave, as a value: one final newline (of `echo`, or
/// of a line typed) dropped.
pub fn from_input(mut input: String) -> Result<SecretValue, SecretError> {
    if input.ends_with('\n') {
        input.pop();
        if input.ends_with('\r') {
            input.pop();
        }
    }
    SecretValue::new(input)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(v: &str) -> SecretValue {
        SecretValue::new(v.into()).unwrap()
    }

    #[test]
    fn a_value_is_never_shown_and_must_fit_a_header() {
        let v = value("ghp_abc123");
        assert_eq!(format!("{v:?} {v}"), "<secret> <secret>");
        let secret = Secret {
            owner: SecretOwner::Uid(1000),
            name: "TOKEN".into(),
            value: v.clone(),
            set_at_ms: 1,
        };
        assert!(!format!("{secret:?}").contains("ghp_abc123"));
        assert_eq!(v.expose(), "ghp_abc123");
        assert_eq!(
            SecretValue::new(String::new()),
            Err(SecretError::EmptyValue)
        );
        for bad in ["a\r\nX-Evil: 1", "a\nb", "a\0b", "\u{7f}"] {
            assert_eq!(
                SecretValue::new(bad.into()),
                Err(SecretError::ControlInValue),
                "{bad:?}"
            );
        }
        assert!(SecretValue::new("Bearer a\tb".into()).is_ok());
        let long = "x".repeat(MAX_VALUE + 1);
        assert_eq!(
            SecretValue::new(long),
            Err(SecretError::LongValue(MAX_VALUE + 1))
        );
        assert_eq!(from_input("tok\n".into()).unwrap().expose(), "tok");
        assert_eq!(from_input("tok\r\n".into()).unwrap().expose(), "tok");
        assert_eq!(
            from_input("tok\n\n".into()),
            Err(SecretError::ControlInValue)
        );
    }

    #[test]
    fn names_are_what_a_placeholder_carries() {
        for good in ["TOKEN", "_x", "gh.token-2", &"a".repeat(MAX_NAME)] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "1abc",
            "a}}",
            "a b",
            "tok{",
            "é",
            &"a".repeat(MAX_NAME + 1),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn users_own_theirs_root_the_networks_and_a_rotation_replaces_the_value() {
        assert_eq!(
            Store::owner_for(1000, None, "set"),
            Ok(SecretOwner::Uid(1000))
        );
        assert_eq!(
            Store::owner_for(1000, Some("shared"), "set"),
            Err(SecretError::NetworkRootOnly("set"))
        );
        let net = SecretOwner::Network("shared".into());
        assert_eq!(Store::owner_for(0, Some("shared"), "set"), Ok(net.clone()));
        let mut store = Store::default();
        assert!(!store.set(net.clone(), "TOKEN", value("net"), 1));
        assert!(!store.set(SecretOwner::Uid(1000), "TOKEN", value("mine"), 2));
        assert!(!store.set(SecretOwner::Uid(1001), "OTHER", value("theirs"), 3));
        // Rotation: the value given replaces the one there.
        assert!(store.set(SecretOwner::Uid(1000), "TOKEN", value("mine2"), 4));
        let kept = |s: &Store| String::from_utf8(s.to_bytes()).unwrap();
        assert!(kept(&store).contains("mine2") && !kept(&store).contains("\"mine\""));
        // A user sees its own and its networks'; root all.
        let names = |l: Vec<SecretListed>| l.into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(
            names(store.list(1000, |n| n == "shared")),
            ["TOKEN", "TOKEN"]
        );
        assert_eq!(names(store.list(1000, |_| false)), ["TOKEN"]);
        assert_eq!(names(store.list(0, |_| false)).len(), 3);
        let err = store.remove(&SecretOwner::Uid(1000), "OTHER").unwrap_err();
        assert_eq!(err.to_string(), "no secret \"OTHER\" of uid 1000");
        store.remove(&SecretOwner::Uid(1000), "TOKEN").unwrap();
        assert!(!kept(&store).contains("mine2") && kept(&store).contains("\"net\""));
        assert_eq!(
            names(store.list(0, |_| false)).len(),
            2,
            "the network's stays"
        );
    }

    #[test]
    fn the_file_keeps_them_and_a_damaged_one_never_quotes_itself() {
        let mut store = Store::default();
        store.set(SecretOwner::Uid(7), "A", value("v1"), 5);
        store.set(SecretOwner::Network("n".into()), "B", value("v2"), 6);
        let (back, dropped) = Store::from_bytes(&store.to_bytes()).unwrap();
        assert_eq!((back, dropped), (store, vec![]));
        let err = Store::from_bytes(b"{\"version\": 1, \"secrets\": [{\"owner\": 7, \"name\": \"A\", \"value\": \"hunter2\"").unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        let bad = br#"{"version":1,"secrets":[{"owner":{"uid":1},"name":"1bad","value":"x","set_at_ms":0}]}"#;
        let (store, dropped) = Store::from_bytes(bad).unwrap();
        assert_eq!(store, Store::default());
        assert_eq!(dropped, ["1bad of uid 1"]);
    }
}
