//! A network's certificate authority: made by the daemon the first time a
//! network needs it, kept as two PEM files in the state directory (the
//! key root's alone, 0600), and given to the network's secrets proxy,
//! which alone signs with it. The guest trusts the certificate
//! (`linnet ca`); the proxy shows the guest a leaf certificate for the
//! host it asked for, issued on demand, valid for a day, and kept until
//! it has an hour left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use thiserror::Error;
use time::OffsetDateTime;

/// How long a network's CA is valid: ten years (a guest image carries it).
const CA_LIFE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a leaf certificate is valid, and how long before its end a
/// new one is issued instead.
const LEAF_LIFE: Duration = Duration::from_secs(24 * 3600);
const LEAF_RENEW: Duration = Duration::from_secs(3600);
/// Leaf certificates start this far in the past: a guest's clock behind
/// the host's still accepts one.
const CLOCK_SKEW: Duration = Duration::from_secs(3600);
/// Leaves cached at most; past it the cache starts over.
const MAX_LEAVES: usize = 4096;

#[derive(Debug, Error)]
pub enum CaError {
    #[error("cannot make a certificate: {0}")]
    Make(#[from] rcgen::Error),
    #[error("the CA's key is not one linnet made: {0}")]
    Key(String),
    #[error("\"{0}\" is not a name a certificate can be issued for")]
    Name(String),
}

/// The subject of `network`'s CA: the same each time, so a CA kept on
/// disk is re-read as the issuer it was made as.
fn ca_params(network: &str, from: SystemTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "linnet");
    dn.push(
        DnType::CommonName,
        format!("linnet secrets CA for network {network}"),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = OffsetDateTime::from(from);
    params.not_after = OffsetDateTime::from(from + CA_LIFE);
    params
}

/// A network's CA as kept on disk: its certificate and key, PEM.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CaFiles {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CaFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CaFiles { <certificate>, <key> }")
    }
}

impl CaFiles {
    /// A new CA for `network` (an ECDSA P-256 key).
    pub fn make(network: &str, now: SystemTime) -> Result<CaFiles, CaError> {
        let key = KeyPair::generate()?;
        let cert = ca_params(network, now).self_signed(&key)?;
        Ok(CaFiles {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A network's CA in the process that signs: it issues the leaves.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    /// One key for every leaf of this process.
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<String, (Arc<CertifiedKey>, SystemTime)>>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ca { <key> }")
    }
}

impl Ca {
    pub fn new(network: &str, files: &CaFiles) -> Result<Ca, CaError> {
        let key = KeyPair::from_pem(&files.key_pem).map_err(|e| CaError::Key(e.to_string()))?;
        let cert = rustls::pki_types::pem::PemObject::from_pem_slice(files.cert_pem.as_bytes())
            .map_err(|e| CaError::Key(format!("its certificate: {e}")))?;
        // The subject and key identifier are the params'; validity is not
        // read back (an issuer carries none).
        let issuer = Issuer::new(ca_params(network, SystemTime::UNIX_EPOCH), key);
        Ok(Ca {
            issuer,
            cert,
            leaf_key: KeyPair::generate()?,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The certificate and key the proxy shows for `name` (as the guest
    /// asked for it, lower case), issued now or kept from before.
    pub fn leaf(&self, name: &str, now: SystemTime) -> Result<Arc<CertifiedKey>, CaError> {
        let mut leaves = self.leaves.lock().expect("not poisoned");
        if let Some((leaf, until)) = leaves.get(name)
            && now + LEAF_RENEW < *until
        {
            return Ok(leaf.clone());
        }
        let leaf = Arc::new(self.issue(name, now)?);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(name.to_string(), (leaf.clone(), now + LEAF_LIFE));
        Ok(leaf)
    }

    fn issue(&self, name: &str, now: SystemTime) -> Result<CertifiedKey, CaError> {
        let mut params = CertificateParams::default();
        let san = name
            .try_into()
            .map_err(|_| CaError::Name(name.to_string()))?;
        params.subject_alt_names = vec![SanType::DnsName(san)];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = OffsetDateTime::from(now - CLOCK_SKEW);
        params.not_after = OffsetDateTime::from(now + LEAF_LIFE);
        let cert = params.signed_by(&self.leaf_key, &self.issuer)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| CaError::Key(e.to_string()))?;
        Ok(CertifiedKey::new(
            vec![cert.der().clone(), self.cert.clone()],
            signer,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::RootCertStore;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};

    fn verifier(ca: &CaFiles) -> Arc<WebPkiServerVerifier> {
        let mut roots = RootCertStore::empty();
        let der: CertificateDer =
            rustls::pki_types::pem::PemObject::from_pem_slice(ca.cert_pem.as_bytes()).unwrap();
        roots.add(der).unwrap();
        WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap()
    }

    #[test]
    fn a_leaf_is_valid_for_its_name_alone_under_its_networks_ca_read_back_from_disk() {
        let now = SystemTime::now();
        let files = CaFiles::make("sandbox", now).unwrap();
        assert!(files.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(files.key_pem.contains("PRIVATE KEY"));
        assert_eq!(format!("{files:?}"), "CaFiles { <certificate>, <key> }");
        let ca = Ca::new("sandbox", &files).unwrap();
        let leaf = ca.leaf("api.example", now).unwrap();
        let check = |verifier: &WebPkiServerVerifier, name: &str, at: SystemTime| {
            verifier.verify_server_cert(
                &leaf.cert[0],
                &leaf.cert[1..],
                &ServerName::try_from(name.to_string()).unwrap(),
                &[],
                UnixTime::since_unix_epoch(at.duration_since(SystemTime::UNIX_EPOCH).unwrap()),
            )
        };
        let ours = verifier(&files);
        check(&ours, "api.example", now).expect("valid for its name");
        check(&ours, "api.example", now - Duration::from_secs(600))
            .expect("valid for a guest whose clock is behind");
        assert!(check(&ours, "other.example", now).is_err(), "not another's");
        assert!(
            check(
                &ours,
                "api.example",
                now + LEAF_LIFE + Duration::from_secs(1)
            )
            .is_err(),
            "not past its day"
        );
        // Another network's CA does not vouch for it.
        let other = CaFiles::make("other", now).unwrap();
        assert!(check(&verifier(&other), "api.example", now).is_err());
        // Kept, then issued anew once it has under an hour left.
        assert!(Arc::ptr_eq(&leaf, &ca.leaf("api.example", now).unwrap()));
        let later = now + LEAF_LIFE - LEAF_RENEW + Duration::from_secs(1);
        assert!(!Arc::ptr_eq(&leaf, &ca.leaf("api.example", later).unwrap()));
    }

    #[test]
    fn a_key_that_is_not_one_is_refused() {
        let mut files = CaFiles::make("sandbox", SystemTime::now()).unwrap();
        files.key_pem = "not a key".into();
        assert!(matches!(Ca::new("sandbox", &files), Err(CaError::Key(_))));
    }
}
