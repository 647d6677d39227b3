// The names a configuration holds, checked as the Rust library checks them (the Python client's
// config/names.py): dependency names, the key prefix, and the characters that would print as
// something they are not, named by their code point.

export const MAX_DEPENDENCY_LEN = 200;

// What the Rust `is_unsafe_char` names: control characters, the line and paragraph separators,
// and Unicode's default-ignorable code points.
const UNSAFE_RANGES: ReadonlyArray<readonly [number, number]> = [
  [0x0000, 0x001f], [0x007f, 0x009f], [0x00ad, 0x00ad], [0x034f, 0x034f], [0x061c, 0x061c],
  [0x115f, 0x1160], [0x17b4, 0x17b5], [0x180b, 0x180f], [0x200b, 0x200f], [0x2028, 0x2029],
  [0x202a, 0x202e], [0x2060, 0x206f], [0x3164, 0x3164], [0xfe00, 0xfe0f], [0xfeff, 0xfeff],
  [0xffa0, 0xffa0], [0xfff0, 0xfff8], [0x1bca0, 0x1bca3], [0x1d173, 0x1d17a], [0xe0000, 0xe0fff],
];

export function isUnsafeChar(c: string): boolean {
  const o = c.codePointAt(0) ?? 0;
  return UNSAFE_RANGES.some(([lo, hi]) => lo <= o && o <= hi);
}

function isControl(o: number): boolean {
  return o < 0x20 || (o >= 0x7f && o <= 0x9f);
}

function isBidiControl(o: number): boolean {
  return o === 0x061c || o === 0x200e || o === 0x200f || (o >= 0x202a && o <= 0x202e) || (o >= 0x2066 && o <= 0x2069);
}

/** `c` as an error message names it: `U+202E (a bidirectional control)`, or ``U+007B `{` ``. */
export function codePoint(c: string): string {
  const o = c.codePointAt(0) ?? 0;
  const hex = o.toString(16).toUpperCase().padStart(4, "0");
  let what: string;
  if (isControl(o)) what = "a control character";
  else if (isBidiControl(o)) what = "a bidirectional control";
  else if (o === 0x2028 || o === 0x2029) what = "a line or paragraph separator";
  else if (isUnsafeChar(c)) what = "an invisible character";
  else if (/\s/u.test(c)) what = "a space";
  else return `U+${hex} \`${c}\``;
  return `U+${hex} (${what})`;
}

const ESCAPES: Record<string, string> = { "\\": "\\\\", '"': '\\"', "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0" };

/** `text` in double quotes, escaped so that it never prints as something it is not. */
export function quoted(text: string): string {
  let out = "";
  for (const ch of text) {
    out += ESCAPES[ch] ?? (isUnsafeChar(ch) ? `\\u{${(ch.codePointAt(0) ?? 0).toString(16)}}` : ch);
  }
  return `"${out}"`;
}

export function utf8Length(text: string): number {
  return Buffer.byteLength(text, "utf8");
}

/** What is wrong with a dependency name, or null (the Rust `validate_name`). */
export function dependencyNameProblem(name: string): string | null {
  if (name.length === 0) return "dependency name is empty";
  const size = utf8Length(name);
  if (size > MAX_DEPENDENCY_LEN) {
    return `dependency name is ${size} bytes long, at most ${MAX_DEPENDENCY_LEN} allowed`;
  }
  for (const c of name) {
    if (c === "{" || c === "}" || isUnsafeChar(c)) {
      return `dependency name contains ${codePoint(c)}; \`{\`, \`}\`, control, bidirectional control and invisible characters are not allowed`;
    }
  }
  return null;
}

/** What is wrong with a Redis key prefix (`redis.key_prefix`), or null. */
export function keyPrefixProblem(prefix: string): string | null {
  const rule = "must be 1 to 64 bytes without `{`, `}`, spaces, control, bidirectional control or invisible characters";
  for (const c of prefix) {
    if (c === "{" || c === "}" || /\s/u.test(c) || isUnsafeChar(c)) return `contains ${codePoint(c)}; ${rule}`;
  }
  const size = utf8Length(prefix);
  if (size < 1 || size > 64) return `is ${size} bytes long; ${rule}`;
  return null;
}

export { redactText, redactUrl } from "./redact.js";
