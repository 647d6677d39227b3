//! TLS for tests: certificates made by the test itself (with the `openssl` command), a
//! `redis-server` with a TLS port, and a TLS front that forwards to a plaintext server (the
//! shared RabbitMQ), so that `rediss://` and `amqps://` meet real handshakes.
//!
//! The certificates: a CA, a server certificate for the host name `localhost` only (so a URL
//! with `127.0.0.1` is "another host"), a client certificate, and a second, unrelated CA (the
//! "wrong CA").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{NEXT_ID, RedisServer, free_port};

/// Certificates and keys in a temporary directory, removed on drop.
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
}

impl TestPki {
    /// Makes the CAs and certificates (EC P-256, valid for two days).
    #[must_use]
    pub fn generate() -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("fleet-budget-pki-{}-{id}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the PKI directory");
        let pki = Self { dir };
        pki.ca("ca", "fleet-budget test CA");
        pki.ca("other-ca", "unrelated test CA");
        pki.leaf(
            "server",
            "localhost",
            "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        pki.leaf(
            "client",
            "fleet-budget worker",
            "extendedKeyUsage=clientAuth\n",
        );
        pki
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("run openssl (is it installed? .ci/run installs it)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ca(&self, name: &str, cn: &str) {
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={cn}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    fn leaf(&self, name: &str, cn: &str, extensions: &str) {
        let ext = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&ext),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"),
        )
        .expect("write the extensions file");
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    /// The directory of the files.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA that signed the server and client certificates.
    #[must_use]
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A CA that signed nothing here.
    #[must_use]
    pub fn other_ca_file(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }

    /// The server certificate (for `localhost` only) and its key.
    #[must_use]
    pub fn server_files(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("server.pem"), self.dir.join("server.key"))
    }

    /// The client certificate and its key.
    #[must_use]
    pub fn client_files(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("client.pem"), self.dir.join("client.key"))
    }

    /// A rustls server configuration with the server certificate (no client certificates).
    #[must_use]
    pub fn server_config(&self) -> rustls::ServerConfig {
        crate::tls::install_crypto_provider();
        let (cert, key) = self.server_files();
        let certs = CertificateDer::pem_file_iter(&cert)
            .expect("read the server certificate")
            .collect::<Result<Vec<_>, _>>()
            .expect("parse the server certificate");
        let key = PrivateKeyDer::from_pem_file(&key).expect("read the server key");
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("a server configuration")
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private `redis-server` with a TLS port (and a plaintext port for the harness's checks).
#[derive(Debug)]
pub struct TlsRedis {
    /// The server; its `url()` is the plaintext port.
    pub server: RedisServer,
    tls_port: u16,
}

impl TlsRedis {
    /// Starts a server whose TLS port presents `pki`'s server certificate; with
    /// `require_client_cert` it refuses clients without a certificate signed by the CA.
    #[must_use]
    pub fn start(pki: &TestPki, require_client_cert: bool) -> Self {
        let tls_port = free_port();
        let (cert, key) = pki.server_files();
        let args = [
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            cert.display().to_string(),
            "--tls-key-file".to_owned(),
            key.display().to_string(),
            "--tls-ca-cert-file".to_owned(),
            pki.ca_file().display().to_string(),
            "--tls-auth-clients".to_owned(),
            if require_client_cert { "yes" } else { "no" }.to_owned(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = RedisServer::start_with(&args, &[]);
        Self { server, tls_port }
    }

    /// The TLS port.
    #[must_use]
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// `rediss://localhost:<tls port>`: the name the certificate is for.
    #[must_use]
    pub fn url(&self) -> String {
        format!("rediss://localhost:{}", self.tls_port)
    }
}

/// A TLS listener on `127.0.0.1` that forwards each connection, decrypted, to a plaintext
/// server: a real TLS handshake in front of the shared RabbitMQ. Stops when dropped.
#[derive(Debug)]
pub struct TlsFront {
    port: u16,
    task: JoinHandle<()>,
}

impl TlsFront {
    /// Listens on a free port, presenting `pki`'s server certificate, forwarding to `upstream`.
    ///
    /// # Panics
    /// No port to listen on.
    pub async fn start(pki: &TestPki, upstream: SocketAddr) -> Self {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(pki.server_config()));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("local address").port();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A failed handshake is what some tests want: the client names it.
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
                });
            }
        });
        Self { port, task }
    }

    /// The port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
