//! The one redactor: everything the process prints, logs or writes into a header goes through it.
//!
//! URLs are shown by allow-list: scheme, user, host, port and path, nothing else (query and
//! fragment dropped, a password shown as `***`). Free text (handler errors, driver errors) keeps
//! its words but loses the values of credential shapes: `Authorization:`, `Proxy-Authorization:`,
//! `Cookie:`, `Set-Cookie:` and `X-Api-Key:` headers, `Bearer` and `Basic` credentials, JSON and
//! form keys naming a password, secret, token or key (any case), AWS access key ids, and every
//! URL in the text (shown as [`redact_url`] shows it).

/// What a redacted value is replaced with.
pub const MASK: &str = "***";

/// `scheme://user:password@host:port/path?query#fragment` → `scheme://user:***@host:port/path`.
///
/// Text without `://` is not a URL: it is redacted as free text ([`redact_text`]).
#[must_use]
pub fn redact_url(url: &str) -> String {
    match split_url(url) {
        Some(parts) => redact_text(&parts.shown()),
        None => redact_text(url),
    }
}

/// Redacts the credential shapes listed in the module documentation anywhere in `text`.
#[must_use]
pub fn redact_text(text: &str) -> String {
    let with_urls = redact_urls_in_text(text);
    let mut masks = Vec::new();
    header_values(&with_urls, &mut masks);
    scheme_credentials(&with_urls, &mut masks);
    key_values(&with_urls, &mut masks);
    aws_key_ids(&with_urls, &mut masks);
    apply_masks(&with_urls, masks)
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

/// The parts of a URL that may be shown.
struct UrlParts<'a> {
    scheme: &'a str,
    user: Option<&'a str>,
    has_password: bool,
    host_port: &'a str,
    path: &'a str,
}

impl UrlParts<'_> {
    fn shown(&self) -> String {
        let mut out = format!("{}://", self.scheme);
        if let Some(user) = self.user {
            // A user name RFC 3986 would not allow (`#`, `/`, `@`, spaces…) is not a name but
            // part of a mangled secret or of the text around it: mask it too, so that the
            // shown form parses back to itself and redacting it again changes nothing.
            if user.chars().all(is_userinfo_char) {
                out.push_str(user);
            } else {
                out.push_str(MASK);
            }
            if self.has_password {
                out.push(':');
                out.push_str(MASK);
            }
            out.push('@');
        }
        out.push_str(self.host_port);
        out.push_str(self.path);
        out
    }
}

/// RFC 3986 `userinfo` characters, without `:` (it ends the user name).
fn is_userinfo_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~%!$&'()*+,;=".contains(c)
}

fn is_scheme_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.'
}

/// Splits `url` (all of it) as `scheme://[user[:password]@]host[:port][/path][?query][#fragment]`.
fn split_url(url: &str) -> Option<UrlParts<'_>> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme.is_empty() || !scheme.chars().all(is_scheme_char) {
        return None;
    }
    // The user information ends at the last `@`, even past a `/`, `?` or `#`: a password
    // written without percent-encoding may hold them, and must not spill into the path.
    let (user, has_password, host_and_after) = match rest.rfind('@') {
        Some(at) => {
            let userinfo = rest.get(..at).unwrap_or("");
            let host_and_after = rest.get(at + 1..).unwrap_or("");
            match userinfo.split_once(':') {
                Some((user, _password)) => (Some(user), true, host_and_after),
                None => (Some(userinfo), false, host_and_after),
            }
        }
        None => (None, false, rest),
    };
    let authority_end = host_and_after
        .find(['/', '?', '#'])
        .unwrap_or(host_and_after.len());
    let (host_port, after) = host_and_after.split_at(authority_end);
    let path_end = after.find(['?', '#']).unwrap_or(after.len());
    Some(UrlParts {
        scheme,
        user,
        has_password,
        host_port,
        path: after.get(..path_end).unwrap_or(""),
    })
}

/// Characters that end a URL inside free text.
fn ends_url_in_text(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '"' | '\'' | '<' | '>' | '`' | '(' | ')' | '[' | ']' | '{' | '}' | ',' | ';'
        )
}

/// Replaces every `scheme://...` in `text` with its shown form.
fn redact_urls_in_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let head = rest.get(..pos).unwrap_or("");
        let scheme_len = head
            .chars()
            .rev()
            .take_while(|&c| is_scheme_char(c))
            .map(char::len_utf8)
            .sum::<usize>();
        let start = pos - scheme_len;
        out.push_str(rest.get(..start).unwrap_or(""));
        let tail = rest.get(pos + 3..).unwrap_or("");
        let end = pos + 3 + tail.find(ends_url_in_text).unwrap_or(tail.len());
        let token = rest.get(start..end).unwrap_or("");
        match split_url(token) {
            Some(parts) => out.push_str(&parts.shown()),
            // `://` without a scheme before it: keep the text, drop any userinfo-like part.
            None => {
                out.push_str("://");
                let after = token.get(3..).unwrap_or("");
                match after.rfind('@') {
                    Some(at) => {
                        out.push_str(MASK);
                        out.push_str(after.get(at..).unwrap_or(""));
                    }
                    None => out.push_str(after),
                }
            }
        }
        rest = rest.get(end..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

/// Header names whose whole value (to the end of the line) is a credential.
const SECRET_HEADERS: [&str; 5] = [
    "proxy-authorization:",
    "authorization:",
    "set-cookie:",
    "cookie:",
    "x-api-key:",
];

/// Key words that make a key secret wherever they appear in it (`clientSecret`, `db_password`).
const SECRET_KEY_PARTS: [&str; 13] = [
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "api-key",
    "access_key",
    "accesskey",
    "private_key",
    "privatekey",
    "authorization",
    "cookie",
];

/// Short key words that make a key secret only as the whole key or its last `_`/`-`/`.` part
/// (`pass`, `db_pass`, but not `bypass`).
const SECRET_KEY_WORDS: [&str; 3] = ["pass", "pwd", "auth"];

/// `Authorization: anything` → `Authorization: ***` to the end of the line.
fn header_values(text: &str, masks: &mut Vec<(usize, usize)>) {
    let lower = text.to_ascii_lowercase();
    for name in SECRET_HEADERS {
        let mut from = 0;
        while let Some(found) = lower.get(from..).and_then(|s| s.find(name)) {
            let name_start = from + found;
            let value_start = name_start + name.len();
            from = value_start;
            let before_ok = lower
                .get(..name_start)
                .and_then(|s| s.chars().next_back())
                .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '-' && c != '_');
            if !before_ok {
                continue;
            }
            let line = text.get(value_start..).unwrap_or("");
            let skip = line.len() - line.trim_start_matches([' ', '\t']).len();
            let end = line.find(['\n', '\r']).unwrap_or(line.len());
            if end > skip {
                masks.push((value_start + skip, value_start + end));
            }
            from = value_start + end;
        }
    }
}

/// Characters that end a credential token in free text.
fn ends_token(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';')
}

/// `Bearer <token>` always; `Basic <token>` when the token is long enough to be encoded
/// credentials (8 characters or more), so that "basic check failed" keeps its words.
fn scheme_credentials(text: &str, masks: &mut Vec<(usize, usize)>) {
    let lower = text.to_ascii_lowercase();
    for (scheme, min_len) in [("bearer", 1), ("basic", 8)] {
        let mut from = 0;
        while let Some(found) = lower.get(from..).and_then(|s| s.find(scheme)) {
            let start = from + found;
            from = start + scheme.len();
            let before_ok = lower
                .get(..start)
                .and_then(|s| s.chars().next_back())
                .is_none_or(|c| !c.is_ascii_alphanumeric());
            let after = text.get(from..).unwrap_or("");
            let gap = after.len() - after.trim_start_matches([' ', '\t']).len();
            if !before_ok || gap == 0 {
                continue;
            }
            let token = after.get(gap..).unwrap_or("");
            let len = token.find(ends_token).unwrap_or(token.len());
            if len >= min_len {
                masks.push((from + gap, from + gap + len));
                // `Bearer Bearer <token>` (a client that writes the scheme twice): a token that
                // is itself a scheme word is read again as a scheme, so the real token after it
                // is masked too.
                let word = token.get(..len).unwrap_or("");
                if !["bearer", "basic"]
                    .iter()
                    .any(|s| word.eq_ignore_ascii_case(s))
                {
                    from += gap + len;
                }
            }
        }
    }
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Whether the key `key` names a secret.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    if SECRET_KEY_PARTS.iter().any(|part| key.contains(part)) {
        return true;
    }
    let last = key.rsplit(['_', '-', '.']).next().unwrap_or("");
    SECRET_KEY_WORDS.contains(&last)
}

/// `password=v`, `"password": "v"`, `pass: v`, `aws_secret_access_key = v`: the value masked.
fn key_values(text: &str, masks: &mut Vec<(usize, usize)>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // Find the next key: a run of key characters not preceded by one.
        let Some(c) = text.get(i..).and_then(|s| s.chars().next()) else {
            break;
        };
        if !is_key_char(c) {
            i += c.len_utf8();
            continue;
        }
        let key_start = i;
        let key_len = text
            .get(i..)
            .unwrap_or("")
            .find(|c: char| !is_key_char(c))
            .unwrap_or(text.len() - i);
        let key_end = key_start + key_len;
        i = key_end;
        let key = text.get(key_start..key_end).unwrap_or("");
        if !is_secret_key(key) {
            continue;
        }
        // Separator: optional closing quote, spaces, `=` or `:`, spaces.
        let mut j = key_end;
        if matches!(bytes.get(j), Some(b'"' | b'\'')) {
            j += 1;
        }
        while matches!(bytes.get(j), Some(b' ' | b'\t')) {
            j += 1;
        }
        if !matches!(bytes.get(j), Some(b'=' | b':')) {
            continue;
        }
        j += 1;
        while matches!(bytes.get(j), Some(b' ' | b'\t')) {
            j += 1;
        }
        let (value_start, value_end) = match bytes.get(j) {
            Some(&q @ (b'"' | b'\'')) => {
                let body = text.get(j + 1..).unwrap_or("");
                let mut end = body.len();
                let mut escaped = false;
                for (k, ch) in body.char_indices() {
                    if escaped {
                        escaped = false;
                    } else if ch == '\\' {
                        escaped = true;
                    } else if ch == char::from(q) {
                        end = k;
                        break;
                    }
                }
                (j + 1, j + 1 + end)
            }
            _ => {
                let body = text.get(j..).unwrap_or("");
                let end = body
                    .find(|c: char| {
                        c.is_whitespace()
                            || matches!(c, '&' | ',' | ';' | '}' | ']' | ')' | '"' | '\'')
                    })
                    .unwrap_or(body.len());
                (j, j + end)
            }
        };
        if value_end > value_start {
            masks.push((value_start, value_end));
        }
        // Scan the value too: a key inside it (`key: "password": "v"`) has a value of its own.
        i = value_start;
    }
}

/// AWS access key ids: `AKIA`/`ASIA` and 16 upper-case letters or digits.
fn aws_key_ids(text: &str, masks: &mut Vec<(usize, usize)>) {
    let bytes = text.as_bytes();
    for prefix in ["AKIA", "ASIA"] {
        let mut from = 0;
        while let Some(found) = text.get(from..).and_then(|s| s.find(prefix)) {
            let start = from + found;
            from = start + prefix.len();
            let id = bytes.get(from..from + 16);
            let ok = id.is_some_and(|id| {
                id.iter()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
            });
            if ok {
                masks.push((start, from + 16));
                from += 16;
            }
        }
    }
}

/// Replaces the byte ranges `masks` (possibly overlapping) of `text` with [`MASK`].
fn apply_masks(text: &str, mut masks: Vec<(usize, usize)>) -> String {
    if masks.is_empty() {
        return text.to_owned();
    }
    masks.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut cursor = 0;
    let mut masked_to = None;
    for (start, end) in masks {
        if end <= cursor {
            continue;
        }
        // A range that overlaps or touches the last one extends it: one mask for both.
        if masked_to.is_none_or(|to| start > to) {
            out.push_str(text.get(cursor..start).unwrap_or(""));
            out.push_str(MASK);
        }
        cursor = end;
        masked_to = Some(end);
    }
    out.push_str(text.get(cursor..).unwrap_or(""));
    out
}

#[cfg(test)]
mod tests;
