//! What an upstream's certificate is checked against before a secret may
//! go to it: the host's trust store (the bundle curl and openssl read:
//! `SSL_CERT_FILE`, else the distribution's) and a network's
//! `upstream_ca:` for private services. Read by the daemon, which hands
//! the proxy the bytes; parsed here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Where distributions keep the bundle, in the order openssl's builds
/// look (Debian, Ubuntu and Alpine; Fedora and RHEL; openSUSE).
const BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
];

/// The host's trust store: `SSL_CERT_FILE` when set (as curl and openssl
/// take it), else the first bundle of the distributions' that is there.
pub fn host_bundle() -> Option<PathBuf> {
    if let Some(file) = std::env::var_os("SSL_CERT_FILE") {
        return Some(PathBuf::from(file));
    }
    BUNDLES
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(Path::to_path_buf)
}

/// A client configuration that trusts the certificates of `bundles` (PEM;
/// what is not a certificate in them is passed over), with no ALPN: each
/// connection sets the guest's offer.
pub fn client_config(
    provider: Arc<CryptoProvider>,
    bundles: &[&[u8]],
) -> Result<rustls::ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    for bundle in bundles {
        let certs = CertificateDer::pem_slice_iter(bundle).filter_map(Result::ok);
        roots.add_parsable_certificates(certs);
    }
    if roots.is_empty() {
        return Err("the trust store holds no certificate".into());
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
