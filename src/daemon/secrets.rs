//! The secrets the daemon holds (`crate::secrets`): kept in the state
//! directory's `secrets.json`, readable by root alone and replaced whole
//! at each change (a temporary file, fsynced, renamed, the directory
//! fsynced); set, removed and listed through the API (`linnet secret`).
//! A value is read from the request that sets it and written to that file,
//! and is never logged, listed or put in an error.

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::client::Client;
use super::errors::DaemonError;
use crate::api::Response;
use crate::config::Config;
use crate::policy::{Policy, SecretRule};
use crate::secret_proxy::grants::Grant;
use crate::secrets::{self, SecretOwner, SecretValue, Store};

/// A `linnet secret` request (`Request::SecretSet`, `SecretRemove`,
/// `SecretList`).
pub(super) enum SecretRequest {
    Set {
        name: String,
        value: SecretValue,
        network: Option<String>,
    },
    Remove {
        name: String,
        network: Option<String>,
    },
    List,
}

/// The file's name in the state directory.
pub(super) const FILE: &str = "secrets.json";

pub(super) struct Secrets {
    path: PathBuf,
    store: Store,
}

impl Secrets {
    /// What the state directory holds. A file that cannot be read is moved
    /// aside (named in the log) and the daemon starts with none: a secret
    /// missing is a request that goes out with its placeholder, never one
    /// that goes out with a wrong value.
    pub fn load(state_dir: &Path) -> Secrets {
        let path = state_dir.join(FILE);
        let store = match std::fs::read(&path) {
            Ok(bytes) => match Store::from_bytes(&bytes) {
                Ok((store, dropped)) => {
                    if !dropped.is_empty() {
                        warn!(file = %path.display(), "secrets left out, their names or values no longer valid: {}", dropped.join(", "));
                    }
                    store
                }
                Err(e) => {
                    let aside = crate::files::move_aside(&path);
                    warn!(file = %path.display(), aside = ?aside.ok(), "cannot read the secrets: {e}; starting with none");
                    Store::default()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Store::default(),
            Err(e) => {
                warn!(file = %path.display(), "cannot read the secrets: {e}; starting with none");
                Store::default()
            }
        };
        Secrets { path, store }
    }

    /// Carries out a `secret set|rm|ls` request of `client`'s.
    pub fn handle(
        &mut self,
        client: &Client,
        config: &Config,
        request: SecretRequest,
    ) -> Result<Response, DaemonError> {
        let known = |network: Option<&str>| match network {
            Some(n) if config.network(n).is_none() => Err(DaemonError::unknown_network(config, n)),
            _ => Ok(()),
        };
        match request {
            SecretRequest::Set {
                name,
                value,
                network,
            } => {
                secrets::check_name(&name)?;
                known(network.as_deref())?;
                let owner = Store::owner_for(client.uid, network.as_deref(), "set")?;
                // Checked again: a request's value came through serde.
                let value = SecretValue::new(value.expose().to_string())?;
                let mut next = self.store.clone();
                let rotated = next.set(owner.clone(), &name, value, now_ms());
                self.save(next)?;
                info!(%owner, secret = %name, rotated, uid = client.uid, "secret set");
                Ok(Response::Ok)
            }
            SecretRequest::Remove { name, network } => {
                known(network.as_deref())?;
                let owner = Store::owner_for(client.uid, network.as_deref(), "remove")?;
                let mut next = self.store.clone();
                next.remove(&owner, &name)?;
                self.save(next)?;
                info!(%owner, secret = %name, uid = client.uid, "secret removed");
                Ok(Response::Ok)
            }
            SecretRequest::List => {
                let may_use = |network: &str| {
                    (config.network(network)).is_some_and(|n| client.allowed_by(&n.allow))
                };
                let secrets = self.store.list(client.uid, may_use);
                Ok(Response::Secrets { secrets })
            }
        }
    }

    /// The grants of a VM of `uid`'s on `network` with `policy`: each of
    /// its secret rules with the value it names now, its owner's for the
    /// owner's rules, the network's for the network's.
    pub fn grants(&self, policy: &Policy, uid: u32, network: &str) -> Vec<Grant> {
        let owned = |rules: &[SecretRule], owner: SecretOwner| -> Vec<Grant> {
            (rules.iter())
                .map(|rule| Grant {
                    rule: rule.clone(),
                    value: self.store.value(&owner, &rule.secret).cloned(),
                })
                .collect()
        };
        let mut grants = owned(&policy.secrets, SecretOwner::Uid(uid));
        grants.extend(owned(
            &policy.network_secrets,
            SecretOwner::Network(network.into()),
        ));
        grants
    }

    /// Writes `next` and makes it the store: the file first, so a store
    /// that could not be written is not the one in use.
    fn save(&mut self, next: Store) -> Result<(), DaemonError> {
        crate::files::write_private_durably(&self.path, &next.to_bytes()).map_err(|source| {
            DaemonError::StateFile {
                what: "cannot write the secrets",
                path: self.path.clone(),
                source,
            }
        })?;
        self.store = next;
        Ok(())
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
