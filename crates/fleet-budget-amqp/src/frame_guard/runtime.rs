//! How lapin is given the guarded socket: lapin's `Connection::connector` takes the function
//! that opens the transport, typed by the runtime's reactor. [`Guarded`] is tokio's reactor
//! with [`GuardedStream`] as its TCP stream; [`open`] connects (TCP, then TLS for `amqps://`,
//! exactly as lapin's own `connect` does) and wraps the result, on every connect and reconnect
//! lapin makes.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use async_rs::traits::Reactor;
use async_rs::util::RuntimeParts;
use async_rs::{Runtime, Tokio};
use futures::Stream;
use futures::io::{AsyncRead, AsyncWrite};
use lapin::tcp::{AMQPUriTcpExt, AsyncTcpStream, OwnedTLSConfig};
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties};

use super::GuardedStream;

/// The socket lapin reads: TCP or TLS, behind the guard.
pub type Socket = GuardedStream<AsyncTcpStream<<Tokio as Reactor>::TcpStream>>;

/// tokio's reactor, whose TCP streams are [`Socket`]s.
#[derive(Debug, Clone)]
pub struct Guarded(Tokio);

impl Reactor for Guarded {
    type TcpStream = Socket;
    type Sleep = <Tokio as Reactor>::Sleep;

    /// Not used by lapin (it opens sockets through `connector` and `tcp_connect_addr`); an
    /// unguarded handle is never handed out, so this refuses.
    fn register<H: Read + Write + Send + 'static>(
        &self,
        socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static> {
        drop(socket);
        Err::<Socket, _>(io::Error::new(
            io::ErrorKind::Unsupported,
            "the guarded AMQP runtime opens its own sockets",
        ))
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.0.sleep(dur)
    }

    fn interval(&self, dur: Duration) -> impl Stream<Item = Instant> + Send + 'static {
        self.0.interval(dur)
    }

    fn tcp_connect_addr(
        &self,
        addr: SocketAddr,
    ) -> impl Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        let connecting = self.0.tcp_connect_addr(addr);
        async move { Ok(GuardedStream::new(AsyncTcpStream::Plain(connecting.await?))) }
    }
}

/// Connects to `uri` with lapin, every byte it reads passing through the guard. Must be called
/// inside a tokio runtime (lapin's default runtime has the same rule).
///
/// # Errors
/// lapin's, as its `Connection::connect_with_config` returns them.
pub async fn open(
    uri: AMQPUri,
    properties: ConnectionProperties,
    tls: OwnedTLSConfig,
) -> lapin::Result<Connection> {
    let tokio = Tokio::current();
    let plain = Runtime::new(tokio.clone());
    let runtime = Runtime::new(RuntimeParts::new(tokio.clone(), Guarded(tokio)));
    Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, _| {
            let stream = uri
                .connect_with_config_async(tls.as_ref(), &plain)
                .await
                .map_err(lapin::Error::from)?;
            Ok(AsyncTcpStream::Plain(GuardedStream::new(stream)))
        },
        properties,
    )
    .await
}
