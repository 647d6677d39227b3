//! The RabbitMQ connection path as a fault: a TCP proxy in the test process that every worker
//! connects through, and that can drop every connection at once (a load balancer restart, a
//! network blip). The workers must reconnect by themselves and lose nothing.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

#[derive(Debug)]
pub(crate) struct Proxy {
    pub(crate) port: u16,
    open: Arc<Mutex<Vec<AbortHandle>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forwards 127.0.0.1:<port> to `target`.
    pub(crate) async fn start(target: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy's port");
        let port = listener.local_addr().expect("its address").port();
        let open: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let registry = Arc::clone(&open);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let pair = tokio::spawn(async move {
                    // A broker that is down (restarting) refuses: the client sees its
                    // connection closed, as it would without the proxy.
                    if let Ok(mut server) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                let mut open = registry.lock().unwrap_or_else(PoisonError::into_inner);
                open.retain(|h| !h.is_finished());
                open.push(pair.abort_handle());
            }
        });
        Self { port, open, task }
    }

    /// Drops every open connection (both sides closed); returns how many there were.
    pub(crate) fn drop_all(&self) -> usize {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let live = open.iter().filter(|h| !h.is_finished()).count();
        for h in open.drain(..) {
            h.abort();
        }
        live
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.drop_all();
    }
}
