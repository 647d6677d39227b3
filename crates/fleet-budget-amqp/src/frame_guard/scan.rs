//! The content-header check, without recursion: what the guard does to one content header frame's
//! payload before lapin's parser sees it.
//!
//! A content header is `class-id u16, weight u16, body-size u64, property-flags u16`, then the
//! properties whose flags are set, in order (amq-protocol 10.6's `basic::parse_properties`):
//! `content-type` and `content-encoding` (short strings), `headers` (a field table),
//! `delivery-mode` and `priority` (octets), `correlation-id`, `reply-to`, `expiration`,
//! `message-id` (short strings), `timestamp` (u64), `type`, `user-id`, `app-id`, `cluster-id`
//! (short strings). lapin refuses a short string that is not UTF-8 and a field table it cannot
//! read; either is a parse error of the whole connection, so the message would come back to the
//! next reader for ever. A table nested deeper than [`MAX_DEPTH`] is worse: the parser recurses
//! once per level on lapin's IO thread and overflows its stack.
//!
//! [`check`] reads the same grammar with an explicit stack (its cost is linear in the payload and
//! its memory one entry per level, bounded by the frame) and says what it would change:
//! - a `headers` entry nested deeper than [`MAX_DEPTH`], or whose value lapin cannot read, is
//!   removed and named in the note (the other entries stay, byte for byte);
//! - a `headers` table whose own entries cannot be read is replaced whole;
//! - a short-string property that is not UTF-8 is removed and named;
//! - properties cut short by the end of the frame are removed.
//!
//! Whatever was removed is written, as text, into the header [`UNREADABLE_HEADERS`] of the
//! `headers` table (added if there was none), so the worker dead-letters the job with why
//! instead of running it without the headers it was sent with. Nothing else changes: a payload
//! with nothing to remove is passed on untouched ([`check`] returns `None`).

use crate::headers::UNREADABLE_HEADERS;

/// The deepest nesting of field tables and arrays passed to lapin's parser (the `headers` table
/// itself is level 1). lapin's IO thread has a 2 MiB stack that an unoptimised build overflows
/// from about 200 levels on (an optimised one from about 2,000); rabbitmq-c bounds the same
/// recursion at 100.
pub const MAX_DEPTH: usize = 100;

/// The largest content header this guard reads whole. RabbitMQ's `frame_max` is 128 KiB by
/// default; a larger content header frame is refused as an I/O error of the connection, as
/// lapin refuses a frame over the negotiated `frame_max`.
pub const MAX_HEADER_FRAME: usize = 16 * 1024 * 1024;

/// A rewritten payload is never made longer than this or than the original, whichever is
/// larger: 4096 bytes is the smallest `frame_max` AMQP 0-9-1 lets a peer negotiate, so lapin
/// accepts it whatever was negotiated.
const FRAME_MIN_SIZE: usize = 4096;

/// The properties after `headers`, in flag order: their name and whether they are a short
/// string (else a fixed number of bytes).
const AFTER_HEADERS: [(&str, Kind); 11] = [
    ("delivery_mode", Kind::Fixed(1)),
    ("priority", Kind::Fixed(1)),
    ("correlation_id", Kind::Short),
    ("reply_to", Kind::Short),
    ("expiration", Kind::Short),
    ("message_id", Kind::Short),
    ("timestamp", Kind::Fixed(8)),
    ("type", Kind::Short),
    ("user_id", Kind::Short),
    ("app_id", Kind::Short),
    ("cluster_id", Kind::Short),
];

#[derive(Clone, Copy)]
enum Kind {
    Short,
    Fixed(usize),
}

/// The bit of property `index` (0 = content_type) in the property flags.
fn bit(index: usize) -> u16 {
    0x8000 >> index
}

/// What [`check`] found wrong with a value: too deep, or unreadable (with where).
enum Problem {
    Deep(usize),
    Unreadable(String),
}

/// A cursor over the payload that never reads past its end.
struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.data.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }

    fn u32(&mut self) -> Option<usize> {
        let b = self.take(4)?;
        let n = u32::from_be_bytes([*b.first()?, *b.get(1)?, *b.get(2)?, *b.get(3)?]);
        usize::try_from(n).ok()
    }

    /// A short string: `Ok(None)` when it is cut short, `Err` when it is not UTF-8.
    fn short_str(&mut self) -> Option<Result<(), ()>> {
        let len = usize::from(self.u8()?);
        let text = self.take(len)?;
        Some(std::str::from_utf8(text).map(drop).map_err(drop))
    }
}

/// The size of a fixed-size value of type `t`, as amq-protocol-types reads it (`from_id`):
/// `None` for the types that carry a length (or are unknown).
fn fixed_size(t: u8) -> Option<usize> {
    Some(match t {
        b'V' => 0,
        b't' | b'b' | b'B' => 1,
        b's' | b'U' | b'u' => 2,
        b'I' | b'i' | b'f' => 4,
        b'D' => 5,
        b'L' | b'l' | b'd' | b'T' => 8,
        _ => return None,
    })
}

/// One open table or array on the explicit stack: where it ends, and whether it is a table
/// (entries have a name before the value).
struct Open {
    end: usize,
    table: bool,
}

/// Checks one value of type `t` at `cursor` (a table or array is `level` deep once entered),
/// without recursion. Leaves the cursor after the value when it could be read.
fn value(cursor: &mut Bytes<'_>, t: u8, level: usize) -> Result<(), Problem> {
    let cut = || Problem::Unreadable(format!("cut short at byte {}", cursor.data.len()));
    let mut stack: Vec<Open> = Vec::new();
    let mut next = Some(t);
    loop {
        if let Some(t) = next.take() {
            match t {
                b'F' | b'A' => {
                    let len = cursor.u32().ok_or_else(cut)?;
                    let end = cursor
                        .at
                        .checked_add(len)
                        .filter(|&e| e <= cursor.data.len());
                    let end = end.ok_or_else(|| {
                        Problem::Unreadable(format!(
                            "a {} of {len} bytes at byte {} runs past the frame",
                            if t == b'F' { "table" } else { "array" },
                            cursor.at
                        ))
                    })?;
                    let depth = level + stack.len();
                    if depth > MAX_DEPTH {
                        return Err(Problem::Deep(depth + deeper_than(cursor, end, t == b'F')));
                    }
                    stack.push(Open {
                        end,
                        table: t == b'F',
                    });
                }
                b'S' | b'x' => {
                    let len = cursor.u32().ok_or_else(cut)?;
                    cursor.take(len).ok_or_else(cut)?;
                }
                other => {
                    let size = fixed_size(other).ok_or_else(|| {
                        Problem::Unreadable(format!(
                            "unknown field type {:?} at byte {}",
                            char::from(other),
                            cursor.at.saturating_sub(1)
                        ))
                    })?;
                    cursor.take(size).ok_or_else(cut)?;
                }
            }
        }
        // Close what ends here; then the next entry of the innermost open table or array.
        let Some(open) = stack.last() else {
            return Ok(());
        };
        if cursor.at == open.end {
            stack.pop();
            continue;
        }
        if cursor.at > open.end {
            return Err(Problem::Unreadable(format!(
                "a value runs past the end of its table at byte {}",
                open.end
            )));
        }
        if open.table {
            let name_at = cursor.at;
            match cursor.short_str() {
                Some(Ok(())) => {}
                Some(Err(())) => {
                    return Err(Problem::Unreadable(format!(
                        "a field name at byte {name_at} is not UTF-8"
                    )));
                }
                None => return Err(cut()),
            }
        }
        next = Some(cursor.u8().ok_or_else(cut)?);
    }
}

/// How many more levels a too-deep value goes on nesting below the one being entered (for the
/// note), following its first entry down while that is a table or array: the shape of a hostile
/// header (`{"a": {"a": ...}}`); other shapes are counted to where they branch. Bounded by the
/// bytes up to `end`: each level takes at least 5 of them.
fn deeper_than(cursor: &Bytes<'_>, end: usize, table: bool) -> usize {
    let mut c = Bytes {
        data: cursor.data.get(..end).unwrap_or_default(),
        at: cursor.at,
    };
    let (mut more, mut is_table) = (0, table);
    loop {
        if is_table && c.short_str().is_none_or(|r| r.is_err()) {
            return more;
        }
        let Some(t @ (b'F' | b'A')) = c.u8() else {
            return more;
        };
        if c.u32().is_none() {
            return more;
        }
        more += 1;
        is_table = t == b'F';
    }
}

/// The `headers` table at `cursor`: its entries kept as they were, and the names and problems
/// of those removed. `Err` when the table's own entries cannot be read (it is replaced whole).
fn headers(cursor: &mut Bytes<'_>, note: &mut Vec<String>) -> Result<Vec<u8>, String> {
    let len = cursor.u32().ok_or("the headers table is cut short")?;
    let start = cursor.at;
    let end = start
        .checked_add(len)
        .filter(|&e| e <= cursor.data.len())
        .ok_or_else(|| format!("the headers table of {len} bytes runs past the frame"))?;
    let mut kept = Vec::with_capacity(len);
    let mut entries = Bytes {
        data: cursor.data.get(..end).unwrap_or_default(),
        at: start,
    };
    while entries.at < end {
        let entry_at = entries.at;
        let name_len = usize::from(entries.u8().ok_or("cut short")?);
        let raw_name = entries.take(name_len).ok_or("a field name is cut short")?;
        let name = std::str::from_utf8(raw_name)
            .map_err(|_| format!("a field name at byte {entry_at} is not UTF-8"))?;
        let t = entries
            .u8()
            .ok_or_else(|| format!("the header {name:?} has no value"))?;
        let value_at = entries.at;
        match value(&mut entries, t, 2) {
            Ok(()) => {
                kept.extend_from_slice(entries.data.get(entry_at..entries.at).unwrap_or_default());
            }
            Err(Problem::Deep(depth)) => {
                note.push(format!(
                    "{name:?} nested {depth} levels deep (this client reads {MAX_DEPTH})"
                ));
                skip(&mut entries, t, value_at, end)?;
            }
            Err(Problem::Unreadable(why)) => {
                note.push(format!("{name:?} unreadable: {why}"));
                skip(&mut entries, t, value_at, end)?;
            }
        }
    }
    cursor.at = end;
    Ok(kept)
}

/// Steps over the value of type `t` at `value_at` by its length prefix (tables, arrays, long
/// strings, byte arrays): a removed value ends where its length says. Other types cannot be
/// stepped over, so the table is replaced whole.
fn skip(entries: &mut Bytes<'_>, t: u8, value_at: usize, end: usize) -> Result<(), String> {
    entries.at = value_at;
    match t {
        b'F' | b'A' | b'S' | b'x' => {
            let len = entries.u32().ok_or("cut short")?;
            let after = entries.at.checked_add(len).filter(|&e| e <= end);
            entries.at = after.ok_or("a value runs past the headers table")?;
            Ok(())
        }
        _ => Err("a value that cannot be stepped over".to_owned()),
    }
}

/// What to pass to lapin instead of `payload` (a content header frame's payload), or `None` to
/// pass it on untouched. See the module's documentation.
#[must_use]
pub fn check(payload: &[u8]) -> Option<Vec<u8>> {
    let mut cursor = Bytes {
        data: payload,
        at: 0,
    };
    // class-id, weight, body size, then the flags; a payload shorter than that is lapin's to
    // refuse (it holds no table to recurse into).
    let fixed = cursor.take(12)?;
    let flags_raw = cursor.take(2)?;
    let flags = u16::from_be_bytes([*flags_raw.first()?, *flags_raw.get(1)?]);
    let mut note: Vec<String> = Vec::new();
    let mut out_flags = flags;
    let mut before = Vec::new(); // content_type and content_encoding, as kept
    let mut table: Option<Vec<u8>> = None; // the headers' entries, as kept
    let mut after = Vec::new(); // the properties after headers, as kept
    let mut cut = false;
    for (index, name) in [(0, "content_type"), (1, "content_encoding")] {
        if flags & bit(index) == 0 {
            continue;
        }
        let at = cursor.at;
        match (!cut).then(|| cursor.short_str()).flatten() {
            Some(Ok(())) => before.extend_from_slice(payload.get(at..cursor.at)?),
            Some(Err(())) => {
                note.push(format!("property {name} was not UTF-8"));
                out_flags &= !bit(index);
            }
            None => {
                cut = true;
                out_flags &= !bit(index);
            }
        }
    }
    if flags & bit(2) != 0 {
        if cut {
            out_flags &= !bit(2);
        } else {
            match headers(&mut cursor, &mut note) {
                Ok(kept) => table = Some(kept),
                Err(why) => {
                    note.push(format!("the headers table could not be read ({why})"));
                    cut = true; // where the rest starts is unknown
                }
            }
        }
    }
    for (offset, (name, kind)) in AFTER_HEADERS.iter().enumerate() {
        let index = 3 + offset;
        if flags & bit(index) == 0 {
            continue;
        }
        let at = cursor.at;
        let read = if cut {
            None
        } else {
            match kind {
                Kind::Short => cursor.short_str(),
                Kind::Fixed(n) => cursor.take(*n).map(|_| Ok(())),
            }
        };
        match read {
            Some(Ok(())) => after.extend_from_slice(payload.get(at..cursor.at)?),
            Some(Err(())) => {
                note.push(format!("property {name} was not UTF-8"));
                out_flags &= !bit(index);
            }
            None => {
                cut = true;
                out_flags &= !bit(index);
            }
        }
    }
    if cut && note.is_empty() {
        note.push("the properties were cut short by the end of the frame".to_owned());
    }
    if note.is_empty() {
        return None;
    }
    let mut text = String::from("removed on receipt, unreadable by this client: ");
    text.push_str(&note.join("; "));
    let mut kept = table.unwrap_or_default();
    let budget = payload.len().max(FRAME_MIN_SIZE);
    // What the note's text may take: the budget less everything else the frame holds (the fixed
    // part and flags, the other properties, the table's length, the kept entries, the note's
    // name, type and length).
    let room = |kept: &[u8]| {
        budget
            .saturating_sub(fixed.len() + 2 + before.len() + after.len() + 4 + kept.len())
            .saturating_sub(1 + UNREADABLE_HEADERS.len() + 1 + 4)
    };
    if room(&kept) < 16 {
        // No room for the note beside what was kept: keep the note, drop the kept headers.
        kept.clear();
    }
    let room = room(&kept);
    truncate_to(&mut text, room);
    kept.push(u8::try_from(UNREADABLE_HEADERS.len()).ok()?);
    kept.extend_from_slice(UNREADABLE_HEADERS.as_bytes());
    kept.push(b'S');
    kept.extend_from_slice(&u32::try_from(text.len()).ok()?.to_be_bytes());
    kept.extend_from_slice(text.as_bytes());
    let mut out = Vec::with_capacity(budget);
    out.extend_from_slice(fixed);
    out.extend_from_slice(&(out_flags | bit(2)).to_be_bytes());
    out.extend_from_slice(&before);
    out.extend_from_slice(&u32::try_from(kept.len()).ok()?.to_be_bytes());
    out.extend_from_slice(&kept);
    out.extend_from_slice(&after);
    Some(out)
}

/// Cuts `text` to at most `max` bytes at a character boundary, marking the cut with `…`.
fn truncate_to(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut at = max.saturating_sub('…'.len_utf8());
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    text.truncate(at);
    if text.len() + '…'.len_utf8() <= max {
        text.push('…');
    }
}
