//! The redactor on free text: never panics, and a secret written after a credential marker never
//! survives, whatever text surrounds it.
#![no_main]

use fleet_budget::redact::redact_text;
use libfuzzer_sys::fuzz_target;

/// Shapes a secret is written in; `{}` is the secret.
const SHAPES: [&str; 12] = [
    "Authorization: Basic {}",
    "Bearer {}",
    "Cookie: {}",
    "X-Api-Key: {}",
    "\"password\": \"{}\"",
    "pass={}",
    "token={}",
    "api_key={}",
    "aws_secret_access_key={}",
    "private_key={}",
    "redis://u:{}@h/0",
    "amqps://h/?secret={}",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = redact_text(text);
    // First byte picks a shape, then `secret|surrounding text`.
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(rest) = std::str::from_utf8(rest) else {
        return;
    };
    let Some((secret, around)) = rest.split_once('|') else {
        return;
    };
    let token_like = |c: char| c.is_ascii_alphanumeric() || "!$%*+/=_~-".contains(c);
    // The oracle holds for a secret that only the shape writes.
    if secret.len() < 8
        || !secret.chars().all(token_like)
        || secret.contains("***")
        || around.contains(secret)
    {
        return;
    }
    let template = SHAPES[usize::from(pick) % SHAPES.len()];
    // A secret that the shape's own words hold (`aws_secret_access_ke` in
    // `aws_secret_access_key=`) shows with them, masked or not.
    if template.replace("{}", "***").contains(secret) {
        return;
    }
    let shape = template.replace("{}", secret);
    let mid = (0..=around.len() / 2)
        .rev()
        .find(|&i| around.is_char_boundary(i))
        .unwrap_or(0);
    let (before, after) = around.split_at(mid);
    // Text around the secret ends at a separator, as in real messages.
    let text = format!("{before} {shape}\n{after}");
    let shown = redact_text(&text);
    assert!(!shown.contains(secret), "{text:?} -> {shown:?}");
});
