//! TLS: for the HTTP port, rustls with a PEM certificate chain and key, offering HTTP/2
//! and HTTP/1.1 through ALPN; and for calls to other nodes of a cluster at `https://`
//! advertised URLs.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// The PEM certificates in the file `path` (at least one); `flag` names it in errors.
fn pem_certificates(path: &Path, flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {flag} {}", path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {flag} {}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{flag} {} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let chain = pem_certificates(cert, "--tls-cert")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("configuring TLS")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the certificate and key do not form a usable pair")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// TLS for this node's calls to other nodes at `https://` advertised URLs: it trusts the
/// PEM certificates of `peer_ca` alone (the private CA that issued the nodes'
/// certificates, say), so that no public CA can vouch for a peer that receives the
/// clients' tokens; without it, the system's roots. A missing or unreadable `peer_ca`
/// stops start-up.
pub fn peer_client_config(peer_ca: Option<&Path>) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    match peer_ca {
        Some(path) => {
            for cert in pem_certificates(path, "--peer-ca")? {
                roots.add(cert).with_context(|| {
                    format!(
                        "--peer-ca {}: a certificate is not usable as a trust anchor",
                        path.display()
                    )
                })?;
            }
        }
        None => {
            let system = rustls_native_certs::load_native_certs();
            for error in &system.errors {
                tracing::debug!(%error, "a system root certificate could not be loaded");
            }
            // Certificates the TLS library cannot use (an old format, say) are skipped.
            let (_, unusable) = roots.add_parsable_certificates(system.certs);
            if unusable > 0 {
                tracing::debug!(unusable, "system root certificates skipped");
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("configuring TLS for calls to other nodes")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
