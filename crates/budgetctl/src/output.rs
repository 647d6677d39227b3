//! Printing: one JSON object on stdout (with its `schema_version`), aligned tables for people.
//!
//! Everything on stdout goes through `out!` / `outln!`, which ignore write errors instead of
//! panicking like `print!` does when stdout is closed (`budgetctl status | head -1`).

/// `print!` that never panics.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// `println!` that never panics.
macro_rules! outln {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

use std::io::Write;

use serde::Serialize;

/// Prints `value` (a struct or a map) as one JSON object on stdout, followed by a newline, with
/// `schema_version` first: the version of the command's shape, written down in
/// `docs/schemas/<command>.schema.json`. Adding a field keeps the version; removing or renaming
/// one bumps it (docs/schemas/README.md).
pub(crate) fn print_json<T: Serialize>(schema_version: u32, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(&Versioned {
        schema_version,
        document: value,
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(())
}

/// A `--json` document with its shape's version in front.
#[derive(Serialize)]
struct Versioned<'a, T> {
    schema_version: u32,
    #[serde(flatten)]
    document: &'a T,
}

/// Formats rows as a table: columns padded to their widest cell, the first left-aligned and the
/// others right-aligned.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    table_aligned(rows, &[0])
}

/// Like [`table`], with the columns of `left` left-aligned.
pub(crate) fn table_aligned(rows: &[Vec<String>], left: &[usize]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, (cell, width)) in row.iter().zip(&widths).enumerate() {
            let sep = if c == 0 { "" } else { "  " };
            if left.contains(&c) {
                line.push_str(&format!("{sep}{cell:<width$}"));
            } else {
                line.push_str(&format!("{sep}{cell:>width$}"));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A number with thousands separators: `2,450`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(2450), "2,450");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn table_aligns() {
        let t = table(&[
            vec!["a".into(), "1".into()],
            vec!["long".into(), "200".into()],
        ]);
        assert_eq!(t, "a       1\nlong  200\n");
    }
}
