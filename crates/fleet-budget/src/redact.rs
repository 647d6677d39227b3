//! Keeping secrets out of logs, headers and output: URL passwords and common credential shapes.

/// `scheme://user:password@host/...` → `scheme://user:***@host/...`. Other text is unchanged.
#[must_use]
pub fn redact_url(url: &str) -> String {
    redact_text(url)
}

/// Redacts every URL password, and values after `password=`, `passwd=`, `pwd=`, `secret=`,
/// `token=`, `api_key=`, `apikey=` and `Bearer `, anywhere in `text`.
#[must_use]
pub fn redact_text(text: &str) -> String {
    let mut out = redact_url_passwords(text);
    for marker in [
        "password=",
        "passwd=",
        "pwd=",
        "secret=",
        "token=",
        "api_key=",
        "apikey=",
        "Bearer ",
    ] {
        out = redact_after(&out, marker);
    }
    out
}

/// Truncates `text` to at most `max` bytes on a character boundary, marking the cut with `…`.
#[must_use]
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let ellipsis = "…";
    let mut end = max.saturating_sub(ellipsis.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ellipsis}", text.get(..end).unwrap_or(""))
}

fn redact_url_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        // The authority ends at the first '/', '?', '#' or whitespace.
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .unwrap_or(tail.len());
        let (authority, after) = tail.split_at(end);
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = authority.get(..at).unwrap_or("");
                let host = authority.get(at..).unwrap_or("");
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(userinfo.get(..colon).unwrap_or(""));
                        out.push_str(":***");
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(host);
            }
            None => out.push_str(authority),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

fn redact_after(text: &str, marker: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let needle = marker.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut cursor = 0;
    while let Some(found) = lower.get(cursor..).and_then(|s| s.find(&needle)) {
        let value_start = cursor + found + needle.len();
        out.push_str(text.get(cursor..value_start).unwrap_or(""));
        let value_len = text
            .get(value_start..)
            .unwrap_or("")
            .find(|c: char| {
                c.is_whitespace() || c == '&' || c == ',' || c == ';' || c == '"' || c == '\''
            })
            .unwrap_or(text.len() - value_start);
        if value_len > 0 {
            out.push_str("***");
        }
        cursor = value_start + value_len;
    }
    out.push_str(text.get(cursor..).unwrap_or(""));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://:hunter2@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("redis://user@h"), "redis://user@h");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn secrets_in_error_text_are_redacted() {
        let t = redact_text(
            "connect to https://bob:pw@api.example/x?token=abc123&x=1 failed, password=p4ss; Authorization: Bearer eyJhb.x",
        );
        assert!(
            !t.contains("pw@")
                && !t.contains("abc123")
                && !t.contains("p4ss")
                && !t.contains("eyJhb"),
            "{t}"
        );
        assert!(t.contains("x=1"), "{t}");
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 100), "héllo");
        let t = truncate(&"é".repeat(100), 11);
        assert!(t.len() <= 11 && t.ends_with('…'), "{t}");
        assert_eq!(truncate("abc", 0), "…");
    }
}
