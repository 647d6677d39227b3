//! Raw AMQP 0-9-1 for tests: a client that never parses a message's headers, to publish what a
//! hostile producer can (headers nested 18,000 levels deep, which lapin's own encoder, and the
//! drop of such a value, would recurse on). Used by this crate's broker tests and by the worker
//! crate outside the workspace (`tests/outside-worker`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation,
    missing_docs
)]

use std::str::FromStr;

use lapin::uri::AMQPUri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One frame: type, channel, payload, end octet.
fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    f.extend_from_slice(payload);
    f.push(0xce);
    f
}

fn method(channel: u16, class: u16, id: u16, args: &[u8]) -> Vec<u8> {
    let mut p = class.to_be_bytes().to_vec();
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(args);
    frame(1, channel, &p)
}

fn short(s: &str) -> Vec<u8> {
    let mut v = vec![u8::try_from(s.len()).unwrap()];
    v.extend_from_slice(s.as_bytes());
    v
}

pub fn long(b: &[u8]) -> Vec<u8> {
    let mut v = u32::try_from(b.len()).unwrap().to_be_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

/// A field table `{"a": {"a": ... {} ...}}` nested `depth` tables deep, encoded.
pub fn nested_table(depth: usize) -> Vec<u8> {
    let mut table = long(&[]);
    for _ in 0..depth {
        let mut entry = short("a");
        entry.push(b'F');
        entry.extend_from_slice(&table);
        table = long(&entry);
    }
    table
}

async fn read_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; 7];
    s.read_exact(&mut head).await.unwrap();
    let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]);
    let mut payload = vec![0u8; usize::try_from(size).unwrap() + 1];
    s.read_exact(&mut payload).await.unwrap();
    payload.pop();
    (head[0], payload)
}

/// A raw AMQP 0-9-1 connection to `url` with channel 1 open: a client that never parses a
/// message's headers.
async fn open_raw(url: &str) -> TcpStream {
    let uri = AMQPUri::from_str(url).unwrap();
    let mut s = TcpStream::connect((uri.authority.host.as_str(), uri.authority.port))
        .await
        .unwrap();
    s.write_all(b"AMQP\x00\x00\x09\x01").await.unwrap();
    read_frame(&mut s).await; // connection.start
    let user = &uri.authority.userinfo;
    let mut start_ok = long(&[]);
    start_ok.extend(short("PLAIN"));
    start_ok.extend(long(
        format!("\0{}\0{}", user.username, user.password).as_bytes(),
    ));
    start_ok.extend(short("en_US"));
    s.write_all(&method(0, 10, 11, &start_ok)).await.unwrap();
    let (_, tune) = read_frame(&mut s).await;
    // tune-ok: the server's channel_max and frame_max, no heartbeat.
    let mut tune_ok = tune[4..10].to_vec();
    tune_ok.extend_from_slice(&[0, 0]);
    s.write_all(&method(0, 10, 31, &tune_ok)).await.unwrap();
    let mut open = short(&uri.vhost);
    open.extend(short(""));
    open.push(0);
    s.write_all(&method(0, 10, 40, &open)).await.unwrap();
    read_frame(&mut s).await; // open-ok
    s.write_all(&method(1, 20, 10, &short(""))).await.unwrap();
    read_frame(&mut s).await; // channel.open-ok
    s
}

/// Publishes one persistent message with `headers` (an encoded table) and message id `id` to
/// `queue` through the default exchange, with publisher confirms, over raw AMQP 0-9-1.
pub async fn publish_raw(url: &str, queue: &str, id: &str, headers: &[u8]) {
    let mut s = open_raw(url).await;
    s.write_all(&method(1, 85, 10, &[0])).await.unwrap();
    read_frame(&mut s).await; // confirm.select-ok
    let mut publish = vec![0, 0];
    publish.extend(short(""));
    publish.extend(short(queue));
    publish.push(1); // mandatory
    s.write_all(&method(1, 60, 40, &publish)).await.unwrap();
    let body = b"job";
    // Content header: class 60, weight 0, body size, flags headers | delivery-mode | message-id.
    let mut header = 60u16.to_be_bytes().to_vec();
    header.extend_from_slice(&[0, 0]);
    header.extend_from_slice(&(body.len() as u64).to_be_bytes());
    header.extend_from_slice(&((1u16 << 13) | (1 << 12) | (1 << 7)).to_be_bytes());
    header.extend_from_slice(headers);
    header.push(2);
    header.extend(short(id));
    s.write_all(&frame(2, 1, &header)).await.unwrap();
    s.write_all(&frame(3, 1, body)).await.unwrap();
    let (kind, answer) = read_frame(&mut s).await;
    assert_eq!(
        (kind, &answer[..4]),
        (1, &[0, 60, 0, 80][..]),
        "basic.ack expected, got {:?}",
        String::from_utf8_lossy(&answer)
    );
    let _ = s.shutdown().await;
}
