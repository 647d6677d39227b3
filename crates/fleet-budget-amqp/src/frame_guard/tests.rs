#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use amq_protocol::frame::{AMQPFrame, parse_frame};
use futures::io::AsyncReadExt;
use lapin::types::{AMQPValue, FieldTable};
use proptest::prelude::*;

use super::GuardedStream;
use super::scan::{MAX_DEPTH, check};
use crate::headers::UNREADABLE_HEADERS;

fn short(s: &[u8]) -> Vec<u8> {
    let mut v = vec![u8::try_from(s.len()).unwrap()];
    v.extend_from_slice(s);
    v
}

fn long(b: &[u8]) -> Vec<u8> {
    let mut v = u32::try_from(b.len()).unwrap().to_be_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

/// `{"a": {"a": ... {} ...}}`, `depth` tables counting the outermost, as an entry's value bytes
/// (type byte first) when `as_value`, else as a table.
fn nested(depth: usize) -> Vec<u8> {
    let mut table = long(&[]);
    for _ in 1..depth {
        let mut entry = short(b"a");
        entry.push(b'F');
        entry.extend_from_slice(&table);
        table = long(&entry);
    }
    table
}

fn entry(name: &[u8], t: u8, value: &[u8]) -> Vec<u8> {
    let mut e = short(name);
    e.push(t);
    e.extend_from_slice(value);
    e
}

/// A content header payload with `message_id` "m-1", type "t" and these header entries.
fn payload(entries: &[Vec<u8>], message_id: &[u8]) -> Vec<u8> {
    let mut p = 60u16.to_be_bytes().to_vec();
    p.extend_from_slice(&0u16.to_be_bytes());
    p.extend_from_slice(&5u64.to_be_bytes());
    let flags: u16 = (1 << 15) | (1 << 13) | (1 << 12) | (1 << 7) | (1 << 5);
    p.extend_from_slice(&flags.to_be_bytes());
    p.extend_from_slice(&short(b"text/plain"));
    p.extend_from_slice(&long(&entries.concat()));
    p.push(2); // delivery_mode
    p.extend_from_slice(&short(message_id));
    p.extend_from_slice(&short(b"t"));
    p
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 1];
    f.extend_from_slice(&long(payload));
    f.push(0xce);
    f
}

/// What lapin's parser makes of a content header payload.
fn parsed(payload: &[u8]) -> lapin::BasicProperties {
    let bytes = frame(payload);
    match parse_frame(&bytes[..]) {
        Ok((rest, AMQPFrame::Header(_, header))) => {
            assert!(rest.is_empty());
            header.properties
        }
        other => panic!("not a content header: {other:?}"),
    }
}

fn headers(props: &lapin::BasicProperties) -> FieldTable {
    props.headers().clone().unwrap_or_default()
}

fn note(props: &lapin::BasicProperties) -> String {
    match headers(props).inner().get(UNREADABLE_HEADERS) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => panic!("no {UNREADABLE_HEADERS}: {other:?}"),
    }
}

#[test]
fn readable_headers_pass_untouched_up_to_the_bound() {
    let task = entry(b"fb-task", b'S', &long(b"index"));
    for depth in [1, 2, 50, MAX_DEPTH] {
        // The headers table is level 1, so an entry nesting `depth - 1` tables reaches `depth`.
        let deep = entry(b"x", b'F', &nested(depth - 1));
        let p = if depth == 1 {
            payload(std::slice::from_ref(&task), b"m-1")
        } else {
            payload(&[task.clone(), deep], b"m-1")
        };
        assert_eq!(check(&p), None, "depth {depth}");
    }
    let arrays = entry(
        b"xs",
        b'A',
        &long(&[b"I".as_slice(), &7i32.to_be_bytes()].concat()),
    );
    let many = entry(b"bytes", b'x', &long(&[0xff; 300]));
    assert_eq!(check(&payload(&[arrays, many], b"m-1")), None);
}

#[test]
fn an_entry_past_the_bound_is_removed_and_named_the_rest_kept() {
    for depth in [MAX_DEPTH + 1, 200, 18_000] {
        let task = entry(b"fb-task", b'S', &long(b"index"));
        let deep = entry(b"evil", b'F', &nested(depth - 1));
        let p = payload(&[task, deep], b"m-1");
        let out = check(&p).expect("rewritten");
        let props = parsed(&out);
        let h = headers(&props);
        assert!(h.inner().get("evil").is_none());
        assert!(
            matches!(h.inner().get("fb-task"), Some(AMQPValue::LongString(s)) if s.as_bytes() == b"index")
        );
        let said = note(&props);
        assert!(
            said.contains(&format!("\"evil\" nested {depth} levels deep")),
            "{said}"
        );
        assert_eq!(props.message_id().as_ref().map(|m| m.as_str()), Some("m-1"));
        assert_eq!(props.kind().as_ref().map(|m| m.as_str()), Some("t"));
        assert_eq!(props.delivery_mode(), &Some(2));
        assert_eq!(
            props.content_type().as_ref().map(|m| m.as_str()),
            Some("text/plain")
        );
        assert!(out.len() <= p.len().max(4096));
    }
}

#[test]
fn arrays_and_mixed_nesting_count_too() {
    // [[[...]]] as arrays: each level is `A` + length + one element.
    let mut value = long(&[]);
    for _ in 0..150 {
        let mut el = vec![b'A'];
        el.extend_from_slice(&value);
        value = long(&el);
    }
    let out = check(&payload(&[entry(b"arr", b'A', &value)], b"m-1")).expect("rewritten");
    let said = note(&parsed(&out));
    assert!(said.contains("\"arr\" nested 152 levels deep"), "{said}");
}

#[test]
fn a_table_whose_entries_cannot_be_read_is_replaced_whole() {
    let bad_name = entry(&[0xff, 0xfe], b'S', &long(b"v"));
    let out = check(&payload(&[bad_name], b"m-1")).expect("rewritten");
    let props = parsed(&out);
    assert!(note(&props).contains("not UTF-8"), "{}", note(&props));
    assert_eq!(headers(&props).inner().len(), 1);
    assert_eq!(props.message_id().as_ref().map(|m| m.as_str()), None);
    let unknown = entry(b"k", b'Z', &[1, 2, 3]);
    let props = parsed(&check(&payload(&[unknown], b"m-1")).expect("rewritten"));
    assert!(
        note(&props).contains("headers table could not be read"),
        "{}",
        note(&props)
    );
}

#[test]
fn an_unreadable_value_is_removed_and_a_bad_property_dropped() {
    let inner_bad = entry(b"t", b'F', &long(&entry(b"n", b'Q', &[0])));
    let ok = entry(b"fb-attempt", b'I', &3i32.to_be_bytes());
    let out = check(&payload(&[ok, inner_bad], &[0xc3, 0x28])).expect("rewritten");
    let props = parsed(&out);
    let said = note(&props);
    assert!(
        said.contains("\"t\" unreadable: unknown field type 'Q'"),
        "{said}"
    );
    assert!(said.contains("property message_id was not UTF-8"), "{said}");
    assert!(headers(&props).inner().contains_key("fb-attempt"));
    assert_eq!(props.message_id(), &None);
    assert_eq!(props.kind().as_ref().map(|m| m.as_str()), Some("t"));
}

#[test]
fn properties_cut_short_are_dropped() {
    let p = payload(&[entry(b"a", b'S', &long(b"b"))], b"m-1");
    let cut = &p[..p.len() - 3];
    let props = parsed(&check(cut).expect("rewritten"));
    assert!(note(&props).contains("cut short"), "{}", note(&props));
    assert!(headers(&props).inner().contains_key("a"));
    assert_eq!(props.kind(), &None);
    // Too short to hold properties: lapin's to refuse, nothing to recurse into.
    assert_eq!(check(&p[..10]), None);
}

/// Through the stream: frames split at every byte boundary come out as lapin would read them,
/// the content header rewritten, the body untouched.
#[test]
fn the_stream_rewrites_only_the_content_header_whatever_the_reads() {
    let deep = payload(&[entry(b"evil", b'F', &nested(18_000))], b"m-1");
    let method = {
        let mut f = vec![1, 0, 1];
        f.extend_from_slice(&long(&[0, 60, 0, 60, 1, 2, 3]));
        f.push(0xce);
        f
    };
    let body = {
        let mut f = vec![3, 0, 1];
        f.extend_from_slice(&long(b"hello"));
        f.push(0xce);
        f
    };
    let wire = [method.clone(), frame(&deep), body.clone()].concat();
    let want = [method, frame(&check(&deep).unwrap()), body].concat();
    for chunk in [1, 7, 100, 1 << 20] {
        let mut guarded = GuardedStream::new(Chunked {
            data: wire.clone(),
            at: 0,
            chunk,
        });
        let mut got = Vec::new();
        futures::executor::block_on(guarded.read_to_end(&mut got)).unwrap();
        assert_eq!(got, want, "chunk {chunk}");
        assert_eq!(guarded.rewritten(), 1);
    }
}

/// A reader that hands out at most `chunk` bytes a read.
struct Chunked {
    data: Vec<u8>,
    at: usize,
    chunk: usize,
}

impl futures::io::AsyncRead for Chunked {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let n = self.chunk.min(buf.len()).min(self.data.len() - self.at);
        let at = self.at;
        buf[..n].copy_from_slice(&self.data[at..at + n]);
        self.at += n;
        std::task::Poll::Ready(Ok(n))
    }
}

proptest! {
    /// Whatever the bytes, the check ends without a panic, and what it writes lapin reads.
    #[test]
    fn any_payload_ends_and_a_rewrite_parses(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut p = 60u16.to_be_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
        p.extend_from_slice(&bytes);
        if let Some(out) = check(&p) {
            let _ = parsed(&out);
        }
    }
}
