//! The frame guard: what lapin reads from the broker passes here first.
//!
//! Messages come from producers this crate does not control, and RabbitMQ keeps and delivers
//! headers that lapin's parser cannot survive: a field table nested some hundreds of levels deep
//! overflows the stack of lapin's IO thread and aborts the whole process (a 128 KiB frame holds
//! about 18,000 levels), before any code of the worker runs; the broker then hands the message
//! to the next reader, which dies too. A short string that is not UTF-8 is milder but has the
//! same loop: a parse error closes the connection and the message comes back for ever.
//!
//! The parser lives in `amq-protocol-types`, which every user of this crate resolves from the
//! registry as published: a `[patch]` in this repository would protect only this repository's
//! own builds. So the guard sits where every user gets it: [`connect`](crate::connect) hands
//! lapin a socket of its own ([`GuardedStream`], over TCP or TLS), which splits what the broker
//! sends into frames and passes every frame on unchanged except a content header whose
//! properties lapin could not read. Those it rewrites ([`scan::check`]): the unreadable header
//! entries or properties are removed and named in the header
//! [`UNREADABLE_HEADERS`](crate::headers::UNREADABLE_HEADERS), so the delivery reaches the
//! worker, which dead-letters it with that text as the error (class `malformed_header`), and the
//! tools (`dlq peek`, `replay`) read it like any other message. Content headers are the only
//! frames a producer writes into; method frames come from the broker itself.
//!
//! Cost: every frame's 7-byte header is looked at; a content header is read once, without
//! recursion; bodies pass through without a copy when lapin's buffer has room.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::io::{AsyncRead, AsyncWrite};

pub mod runtime;
pub mod scan;

pub use scan::{MAX_DEPTH, MAX_HEADER_FRAME};

#[cfg(test)]
mod tests;

/// AMQP frame type of a content header.
const CONTENT_HEADER: u8 = 2;
/// Frame header: type (1), channel (2), payload size (4).
const FRAME_HEADER: usize = 7;

/// Where the reader is in the broker's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the first byte: a broker that refuses the protocol version answers with its own
    /// protocol header (`AMQP....`) instead of a frame, and closes.
    Start,
    /// At a frame boundary.
    Frame,
    /// Inside a frame that passes unchanged: this many bytes (payload and end octet) to go.
    Through(usize),
    /// Everything passes unchanged (after a protocol header from the broker).
    Raw,
}

/// A socket whose reads are split into AMQP frames, with content headers checked by
/// [`scan::check`] before lapin parses them. Writes pass through.
#[derive(Debug)]
pub struct GuardedStream<S> {
    inner: S,
    at: At,
    /// Read from `inner`, not yet looked at.
    raw: Vec<u8>,
    /// Looked at, ready for the reader (from `ready_from` on).
    ready: Vec<u8>,
    ready_from: usize,
    /// Content headers rewritten on this connection.
    rewritten: u64,
}

impl<S> GuardedStream<S> {
    /// Guards reads from `inner`, which must be at the start of an AMQP connection.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            at: At::Start,
            raw: Vec::new(),
            ready: Vec::new(),
            ready_from: 0,
            rewritten: 0,
        }
    }

    /// Moves what `raw` holds, frame by frame, into `ready`. Stops at a frame that is not all
    /// there yet.
    fn look(&mut self) -> io::Result<()> {
        loop {
            match self.at {
                At::Raw => {
                    self.ready.append(&mut self.raw);
                    return Ok(());
                }
                At::Start => match self.raw.first() {
                    None => return Ok(()),
                    Some(b'A') => self.at = At::Raw,
                    Some(_) => self.at = At::Frame,
                },
                At::Through(0) => self.at = At::Frame,
                At::Through(n) => {
                    let take = n.min(self.raw.len());
                    if take == 0 {
                        return Ok(());
                    }
                    self.ready.extend(self.raw.drain(..take));
                    self.at = At::Through(n - take);
                }
                At::Frame => {
                    let Some(head) = self.raw.get(..FRAME_HEADER) else {
                        return Ok(());
                    };
                    let kind = head.first().copied().unwrap_or_default();
                    let size = head
                        .get(3..7)
                        .and_then(|b| <[u8; 4]>::try_from(b).ok())
                        .map_or(0, u32::from_be_bytes);
                    let size = usize::try_from(size).unwrap_or(usize::MAX);
                    if kind != CONTENT_HEADER {
                        self.ready.extend(self.raw.drain(..FRAME_HEADER));
                        self.at = At::Through(size.saturating_add(1));
                        continue;
                    }
                    if size > MAX_HEADER_FRAME {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "the broker sent a content header of {size} bytes; this client \
                                 reads at most {MAX_HEADER_FRAME}"
                            ),
                        ));
                    }
                    let whole = FRAME_HEADER + size + 1;
                    if self.raw.len() < whole {
                        return Ok(());
                    }
                    let frame: Vec<u8> = self.raw.drain(..whole).collect();
                    match frame
                        .get(FRAME_HEADER..FRAME_HEADER + size)
                        .and_then(scan::check)
                    {
                        None => self.ready.extend_from_slice(&frame),
                        Some(payload) => {
                            self.rewritten += 1;
                            tracing::warn!(
                                channel = u16::from_be_bytes([
                                    frame.get(1).copied().unwrap_or_default(),
                                    frame.get(2).copied().unwrap_or_default()
                                ]),
                                was_bytes = size,
                                now_bytes = payload.len(),
                                "a delivery's headers could not be read safely; the unreadable \
                                 parts were removed on receipt and named in the header {}",
                                crate::headers::UNREADABLE_HEADERS
                            );
                            let len = u32::try_from(payload.len()).map_err(|_| {
                                io::Error::new(
                                    io::ErrorKind::InvalidData,
                                    "rewritten frame too large",
                                )
                            })?;
                            self.ready
                                .extend_from_slice(frame.get(..3).unwrap_or_default());
                            self.ready.extend_from_slice(&len.to_be_bytes());
                            self.ready.extend_from_slice(&payload);
                            self.ready.push(frame.last().copied().unwrap_or(0xce));
                        }
                    }
                }
            }
        }
    }

    /// Content headers rewritten so far on this connection.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            if this.ready_from < this.ready.len() {
                let available = this.ready.get(this.ready_from..).unwrap_or_default();
                let n = available.len().min(buf.len());
                if let (Some(to), Some(from)) = (buf.get_mut(..n), available.get(..n)) {
                    to.copy_from_slice(from);
                }
                this.ready_from += n;
                if this.ready_from == this.ready.len() {
                    this.ready.clear();
                    this.ready_from = 0;
                }
                return Poll::Ready(Ok(n));
            }
            // A body or method passing through, with nothing buffered: read it straight into
            // the caller's buffer, never past the frame's end.
            if let At::Through(n) = this.at
                && n > 0
                && this.raw.is_empty()
                && !buf.is_empty()
            {
                let cap = n.min(buf.len());
                let Some(into) = buf.get_mut(..cap) else {
                    return Poll::Ready(Ok(0));
                };
                let got = std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, into))?;
                this.at = At::Through(n - got.min(n));
                return Poll::Ready(Ok(got));
            }
            let mut chunk = [0u8; 16 * 1024];
            let got = std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk))?;
            if got == 0 {
                // End of stream: hand on what is left as it is (lapin reports the cut).
                this.ready.append(&mut this.raw);
                if this.ready.is_empty() {
                    return Poll::Ready(Ok(0));
                }
                continue;
            }
            this.raw
                .extend_from_slice(chunk.get(..got).unwrap_or_default());
            this.look()?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}
