//! TLS for the connections to Redis (`rediss://`) and RabbitMQ (`amqps://`): the certificate
//! files of a configuration, and the names of the ways a handshake fails.
//!
//! Why names: a TLS URL must never end up connected in plaintext, and an operator who meets a
//! refusal should learn which of the usual mistakes it is — a plaintext server behind a TLS
//! URL, a certificate from a CA that is not trusted, a certificate issued for another host
//! name — not read a bare I/O error. [`TlsFailure::of`] finds the rustls error inside the error
//! chain of either client library and names it.
//!
//! Both clients use rustls with the *ring* crypto provider (one C/assembly build of about
//! 20 s here, against several minutes and a CMake-style build for aws-lc-rs; see the commit
//! that chose it), the system's root certificates (`rustls-native-certs`, which the Redis
//! client requires anyway), and verify the certificate and the host name always: no
//! configuration turns verification off.

use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificate files of one connection (`redis.tls_*` or `amqp.tls_*`). All optional:
/// without a CA file the system's root certificates are trusted; a client certificate needs
/// its key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file of the CA certificate(s) that signed the server's certificate.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (chain), for servers that ask for one.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key_file: Option<PathBuf>,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Paths only: the files' contents are never read into a Debug output.
        f.debug_struct("TlsFiles")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

/// The PEM contents of [`TlsFiles`], read and checked.
#[derive(Clone, Default)]
pub struct TlsMaterial {
    /// The CA certificate(s), PEM.
    pub ca_pem: Option<Vec<u8>>,
    /// The client certificate (chain) and its private key, PEM.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("client", &self.client.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A certificate file that cannot be used; names the setting and the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFileError {
    /// The file cannot be read.
    #[error("{key} {path}: cannot be read: {source}")]
    Read {
        /// The setting (`redis.tls_ca_file`).
        key: String,
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds no PEM item of the kind expected, or a broken one.
    #[error("{key} {path}: {detail}")]
    NotPem {
        /// The setting.
        key: String,
        /// The path.
        path: String,
        /// What was expected and found.
        detail: String,
    },
    /// A client certificate without its key, or a key without its certificate.
    #[error(
        "{0}_cert_file and {0}_key_file must be set together (a client certificate needs its key)"
    )]
    Unpaired(String),
}

impl TlsFiles {
    /// Whether any file is set.
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Reads and checks the files; `section` (`redis` or `amqp`) names the settings in errors.
    ///
    /// # Errors
    /// A file cannot be read or holds no certificate (no key), or a client certificate comes
    /// without its key or the other way round.
    pub fn load(&self, section: &str) -> Result<TlsMaterial, TlsFileError> {
        let ca_pem = match &self.ca_file {
            Some(path) => Some(read_pem(section, "tls_ca_file", path, Pem::Certificates)?),
            None => None,
        };
        let client = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some((
                read_pem(section, "tls_cert_file", cert, Pem::Certificates)?,
                read_pem(section, "tls_key_file", key, Pem::PrivateKey)?,
            )),
            (None, None) => None,
            _ => return Err(TlsFileError::Unpaired(format!("{section}.tls"))),
        };
        Ok(TlsMaterial { ca_pem, client })
    }
}

#[derive(Clone, Copy)]
enum Pem {
    Certificates,
    PrivateKey,
}

fn read_pem(section: &str, name: &str, path: &Path, kind: Pem) -> Result<Vec<u8>, TlsFileError> {
    let key = format!("{section}.{name}");
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| TlsFileError::Read {
        key: key.clone(),
        path: shown.clone(),
        source,
    })?;
    let problem = match kind {
        Pem::Certificates => {
            let mut count = 0_usize;
            let mut broken = None;
            for cert in CertificateDer::pem_slice_iter(&bytes) {
                match cert {
                    Ok(_) => count += 1,
                    Err(e) => {
                        broken = Some(format!("holds a broken PEM certificate ({e})"));
                        break;
                    }
                }
            }
            broken.or_else(|| {
                (count == 0).then(|| "holds no PEM certificate (BEGIN CERTIFICATE)".to_owned())
            })
        }
        // The key's own error text could quote the key: say only what was wrong.
        Pem::PrivateKey => PrivateKeyDer::from_pem_slice(&bytes).err().map(|_| {
            "holds no PEM private key (BEGIN PRIVATE KEY, RSA or EC PRIVATE KEY)".to_owned()
        }),
    };
    match problem {
        Some(detail) => Err(TlsFileError::NotPem {
            key,
            path: shown,
            detail,
        }),
        None => Ok(bytes),
    }
}

/// Whether `url` asks for TLS: `rediss://` or `amqps://`, in any case.
#[must_use]
pub fn is_tls_url(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("amqps")
    })
}

/// Makes ring the process's rustls crypto provider, unless one is set already. Both client
/// libraries build their TLS configurations from the process default.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err means another thread installed one first: that one is used, fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A TLS handshake that got no answer at all from a server that accepted the TCP connection:
/// what a plaintext Redis does with a TLS greeting (it waits for the end of a command line that
/// never comes). Named so that it is not taken for a slow network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the server accepted the connection but did not answer the TLS handshake within {after:?}")]
pub struct HandshakeUnanswered {
    /// How long the client waited.
    pub after: std::time::Duration,
}

/// Why a TLS connection was refused, as an operator would fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The server did not answer the handshake with TLS: a plaintext server behind a TLS URL.
    NotTls,
    /// The server's certificate is not signed by a trusted CA (wrong or missing CA file).
    UntrustedCertificate,
    /// The server's certificate is not valid for the host name of the URL.
    WrongHost,
    /// The certificate is trusted and for this host but unusable (expired, not yet valid,
    /// revoked, wrong purpose).
    BadCertificate,
    /// The server ended the handshake with an alert (for instance, it requires a client
    /// certificate, or refused the one sent).
    RefusedByServer,
}

impl TlsFailure {
    /// The failure named in the chain of `error`, if it is a TLS failure.
    #[must_use]
    pub fn of(error: &(dyn StdError + 'static)) -> Option<Self> {
        let mut text = String::new();
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(found) = rustls_error(e).and_then(Self::of_rustls) {
                return Some(found);
            }
            if find::<HandshakeUnanswered>(e).is_some() {
                return Some(Self::NotTls);
            }
            text.push_str(&e.to_string());
            text.push('\n');
            next = e.source();
        }
        Self::of_text(&text)
    }

    fn of_rustls(e: &rustls::Error) -> Option<Self> {
        use rustls::CertificateError as C;
        Some(match e {
            rustls::Error::InvalidCertificate(c) => match c {
                C::NotValidForName | C::NotValidForNameContext { .. } => Self::WrongHost,
                C::UnknownIssuer | C::BadSignature => Self::UntrustedCertificate,
                _ => Self::BadCertificate,
            },
            rustls::Error::InvalidMessage(_)
            | rustls::Error::InappropriateMessage { .. }
            | rustls::Error::InappropriateHandshakeMessage { .. } => Self::NotTls,
            rustls::Error::AlertReceived(_) => Self::RefusedByServer,
            _ => return None,
        })
    }

    /// The same from an error's text only, for a library that keeps the message but hides the
    /// error (the Redis client's errors hold theirs in an `Arc`, which cannot be downcast), or
    /// a caller that has only the message.
    #[must_use]
    pub fn of_text(text: &str) -> Option<Self> {
        let has = |needle: &str| text.contains(needle);
        if has("NotValidForName") || has("not valid for name") {
            Some(Self::WrongHost)
        } else if has("UnknownIssuer") || has("BadSignature") {
            Some(Self::UntrustedCertificate)
        } else if has("invalid peer certificate") {
            Some(Self::BadCertificate)
        } else if has("corrupt message")
            || has("tls handshake eof")
            || has("did not answer the TLS handshake")
        {
            Some(Self::NotTls)
        } else if has("received fatal alert") {
            Some(Self::RefusedByServer)
        } else {
            None
        }
    }

    /// A short name for logs and tests.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotTls => "not_tls",
            Self::UntrustedCertificate => "untrusted_certificate",
            Self::WrongHost => "wrong_host",
            Self::BadCertificate => "bad_certificate",
            Self::RefusedByServer => "refused_by_server",
        }
    }

    /// What happened and what to check; `section` is `redis` or `amqp`.
    #[must_use]
    pub fn explain(self, section: &str) -> String {
        match self {
            Self::NotTls => format!(
                "the server did not answer the TLS handshake with TLS: is it a plaintext port? \
                 (nothing was sent in plaintext; use the server's TLS port, or a {section}:// URL \
                 only on a trusted network)"
            ),
            Self::UntrustedCertificate => format!(
                "the server's certificate is not signed by a trusted CA: set {section}.tls_ca_file \
                 (or FLEET_BUDGET_{}_CA_FILE) to the CA that signed it",
                section.to_ascii_uppercase()
            ),
            Self::WrongHost => "the server's certificate is not valid for the host name of the \
                 URL: connect by a name the certificate lists"
                .to_owned(),
            Self::BadCertificate => {
                "the server's certificate is trusted but cannot be used (expired, not yet valid \
                 or not for servers)"
                    .to_owned()
            }
            Self::RefusedByServer => format!(
                "the server ended the TLS handshake: does it require a client certificate \
                 ({section}.tls_cert_file and {section}.tls_key_file)?"
            ),
        }
    }
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rustls error `e` is, or wraps as an I/O error.
fn rustls_error<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    find::<rustls::Error>(e)
}

/// The `T` that `e` is, or wraps as an I/O error (whose `source` skips the wrapped error).
fn find<'a, T: StdError + 'static>(e: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    if let Some(found) = e.downcast_ref::<T>() {
        return Some(found);
    }
    let io = e.downcast_ref::<std::io::Error>()?;
    let inner = io.get_ref()?;
    let inner: &(dyn StdError + 'static) = inner;
    find(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_errors_inside_io_errors_are_named() {
        let cases = [
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
                TlsFailure::UntrustedCertificate,
            ),
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName),
                TlsFailure::WrongHost,
            ),
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::Expired),
                TlsFailure::BadCertificate,
            ),
            (
                rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
                TlsFailure::NotTls,
            ),
        ];
        for (error, expected) in cases {
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, error);
            assert_eq!(TlsFailure::of(&io), Some(expected), "{io}");
        }
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(TlsFailure::of(&plain), None);
    }

    #[test]
    fn tls_urls_are_recognised_in_any_case() {
        assert!(is_tls_url("rediss://h:1"));
        assert!(is_tls_url("AMQPS://u:p@h/v"));
        assert!(!is_tls_url("redis://h"));
        assert!(!is_tls_url("amqp://h"));
        assert!(!is_tls_url("rediss"));
    }

    #[test]
    fn files_that_are_not_pem_are_named_without_their_contents() {
        let dir = std::env::temp_dir().join(format!("fb-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "hunter2-not-a-key").unwrap();
        let files = TlsFiles {
            ca_file: Some(junk.clone()),
            ..TlsFiles::default()
        };
        let e = files.load("redis").unwrap_err().to_string();
        assert!(
            e.contains("redis.tls_ca_file") && e.contains("no PEM certificate"),
            "{e}"
        );
        let files = TlsFiles {
            cert_file: Some(junk),
            ..TlsFiles::default()
        };
        let e = files.load("amqp").unwrap_err().to_string();
        assert!(
            e.contains("amqp.tls_cert_file and amqp.tls_key_file"),
            "{e}"
        );
        let missing = TlsFiles {
            ca_file: Some(dir.join("missing.pem")),
            ..TlsFiles::default()
        };
        let e = missing.load("amqp").unwrap_err().to_string();
        assert!(
            e.contains("amqp.tls_ca_file") && e.contains("missing.pem"),
            "{e}"
        );
        assert!(!e.contains("hunter2"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
