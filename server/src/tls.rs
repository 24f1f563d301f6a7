//! TLS termination for labs without a reverse proxy: `TESSERA_TLS_CERT` (PEM chain, leaf
//! first) and `TESSERA_TLS_KEY` (PEM private key). The files are re-read when either
//! changes (checked every few seconds), so a renewed certificate (certbot, a lab CA's
//! cron job) is served without a restart; a pair that does not load (half written, key
//! and certificate from different pairs) is logged and the previous one kept.
//!
//! [`TlsListener`] is an [`axum::serve::Listener`]: handshakes run on their own tasks (a
//! slow or silent client holds up nobody), and only finished ones are handed to axum.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificate and key files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// How often the files are checked for a change.
    pub poll: Duration,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads and checks a certificate chain and its key.
fn load(files: &TlsFiles, provider: &CryptoProvider) -> anyhow::Result<CertifiedKey> {
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("TESSERA_TLS_CERT {}: {e}", files.cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!(
            "TESSERA_TLS_CERT {}: no certificate in the file",
            files.cert.display()
        );
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| anyhow::anyhow!("TESSERA_TLS_KEY {}: {e}", files.key.display()))?;
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| anyhow::anyhow!("TESSERA_TLS_KEY {}: {e}", files.key.display()))?;
    let pair = CertifiedKey::new(certs, key);
    pair.keys_match().map_err(|e| {
        anyhow::anyhow!(
            "TESSERA_TLS_KEY {} is not the key of TESSERA_TLS_CERT {}: {e}",
            files.key.display(),
            files.cert.display()
        )
    })?;
    Ok(pair)
}

/// Serves whichever pair was loaded last.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// What identifies a version of a file without reading it.
fn stamp(p: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// A TCP listener that hands axum finished TLS connections.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for TlsListener {
    /// The accept loop (and with it the socket) and the file watch end with the listener.
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl TlsListener {
    /// Loads the pair (an error stops the server from starting) and starts accepting.
    pub fn new(tcp: TcpListener, files: TlsFiles) -> anyhow::Result<TlsListener> {
        let provider = provider();
        let first = load(&files, &provider)?;
        let current = Arc::new(Current(RwLock::new(Arc::new(first))));
        let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        // The server speaks HTTP/1.1 (axum's `http1`; WebSockets upgrade on it).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let accept = tokio::spawn(accept_loop(tcp, acceptor, tx));
        let watch = tokio::spawn(watch(files, provider, current));
        Ok(TlsListener {
            ready,
            local,
            tasks: vec![accept, watch],
        })
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: back off as axum's own loop does.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// Re-reads the pair whenever either file's time or size changes.
async fn watch(files: TlsFiles, provider: Arc<CryptoProvider>, current: Arc<Current>) {
    let mut seen = (stamp(&files.cert), stamp(&files.key));
    loop {
        tokio::time::sleep(files.poll).await;
        let now = (stamp(&files.cert), stamp(&files.key));
        if now == seen {
            continue;
        }
        seen = now;
        match load(&files, &provider) {
            Ok(pair) => {
                *current.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(pair);
                tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
            }
            // Tried again at the files' next change (the second half of a renewal).
            Err(e) => {
                tracing::warn!("TLS certificate not reloaded, the previous one stays: {e:#}")
            }
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept loop never ends on its own; it is aborted only with `self`.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The peer of a TLS connection. axum gives plain TCP connections `ConnectInfo<SocketAddr>`
/// itself; `http::router`'s client-address layer reads this one too.
#[derive(Debug, Clone, Copy)]
pub struct TlsPeer(pub SocketAddr);

impl Connected<IncomingStream<'_, TlsListener>> for TlsPeer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        TlsPeer(*stream.remote_addr())
    }
}
