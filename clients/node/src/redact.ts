// The one redactor, as the Rust library's (crates/fleet-budget/src/redact.rs) and the Python
// client's (redact.py), step for step: what this client logs or writes into a header goes through
// it. URLs are shown by allow-list: scheme, user, host, port and path (query and fragment
// dropped, a password shown as `***`). Free text keeps its words but loses the values of
// credential shapes: `Authorization:`, `Proxy-Authorization:`, `Cookie:`, `Set-Cookie:` and
// `X-Api-Key:` headers, `Bearer` and `Basic` credentials, keys naming a password, secret, token
// or key, AWS access key ids, and every URL in the text.

export const MASK = "***";

// Rust's char::is_whitespace (Unicode White_Space).
const WHITESPACE = new Set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000");
const SECRET_HEADERS = ["proxy-authorization:", "authorization:", "set-cookie:", "cookie:", "x-api-key:"];
const SECRET_KEY_PARTS = ["password", "passwd", "secret", "token", "apikey", "api_key", "api-key", "access_key", "accesskey",
  "private_key", "privatekey", "authorization", "cookie"];
const SECRET_KEY_WORDS = ["pass", "pwd", "auth"];

type Mask = [number, number];

const asciiAlnum = (c: string | undefined): boolean => c !== undefined && /^[A-Za-z0-9]$/.test(c);
const lower = (text: string): string => text.replace(/[A-Z]/g, (c) => c.toLowerCase());
const userinfoChar = (c: string): boolean => asciiAlnum(c) || "-._~%!$&'()*+,;=".includes(c);
const schemeChar = (c: string | undefined): boolean => c !== undefined && (asciiAlnum(c) || "+-.".includes(c));
const endsUrl = (c: string): boolean => WHITESPACE.has(c) || "\"'<>`()[]{},;".includes(c);
const endsToken = (c: string): boolean => WHITESPACE.has(c) || "\"',;".includes(c);
const keyChar = (c: string | undefined): boolean => c !== undefined && (asciiAlnum(c) || "_-.".includes(c));

function findAny(text: string, chars: string, start = 0): number {
  for (let i = start; i < text.length; i++) if (chars.includes(text[i]!)) return i;
  return -1;
}

function lstripLength(text: string): number {
  let i = 0;
  while (i < text.length && (text[i] === " " || text[i] === "\t")) i++;
  return i;
}

type UrlParts = [scheme: string, user: string | null, hasPassword: boolean, hostPort: string, path: string];

function splitUrl(url: string): UrlParts | null {
  const sep = url.indexOf("://");
  if (sep <= 0) return null;
  const scheme = url.slice(0, sep);
  if (![...scheme].every(schemeChar)) return null;
  const rest = url.slice(sep + 3);
  const at = rest.lastIndexOf("@");
  let user: string | null = null;
  let hasPassword = false;
  let hostAndAfter = rest;
  if (at >= 0) {
    const userinfo = rest.slice(0, at);
    hostAndAfter = rest.slice(at + 1);
    const colon = userinfo.indexOf(":");
    user = colon >= 0 ? userinfo.slice(0, colon) : userinfo;
    hasPassword = colon >= 0;
  }
  let authorityEnd = findAny(hostAndAfter, "/?#");
  if (authorityEnd < 0) authorityEnd = hostAndAfter.length;
  const after = hostAndAfter.slice(authorityEnd);
  const pathEnd = findAny(after, "?#");
  return [scheme, user, hasPassword, hostAndAfter.slice(0, authorityEnd), after.slice(0, pathEnd >= 0 ? pathEnd : after.length)];
}

function shown([scheme, user, hasPassword, hostPort, path]: UrlParts): string {
  let out = `${scheme}://`;
  if (user !== null) {
    const shownUser = [...user].every(userinfoChar) ? user : MASK;
    out += shownUser + (hasPassword ? `:${MASK}` : "") + "@";
  }
  return out + hostPort + path;
}

function redactUrlsInText(text: string): string {
  const out: string[] = [];
  let rest = text;
  let pos: number;
  while ((pos = rest.indexOf("://")) >= 0) {
    let start = pos;
    while (start > 0 && schemeChar(rest[start - 1])) start--;
    out.push(rest.slice(0, start));
    let end = pos + 3;
    while (end < rest.length && !endsUrl(rest[end]!)) end++;
    const token = rest.slice(start, end);
    const parts = splitUrl(token);
    if (parts !== null) {
      out.push(shown(parts));
    } else {
      out.push("://");
      const after = token.slice(3);
      const at = after.lastIndexOf("@");
      out.push(at >= 0 ? MASK + after.slice(at) : after);
    }
    rest = rest.slice(end);
  }
  out.push(rest);
  return out.join("");
}

function headerValues(text: string, masks: Mask[]): void {
  const low = lower(text);
  for (const name of SECRET_HEADERS) {
    let from = 0;
    let found: number;
    while ((found = low.indexOf(name, from)) >= 0) {
      const valueStart = found + name.length;
      from = valueStart;
      const before = found > 0 ? low[found - 1] : undefined;
      if (before !== undefined && (asciiAlnum(before) || before === "-" || before === "_")) continue;
      const line = text.slice(valueStart);
      const skip = lstripLength(line);
      let end = findAny(line, "\n\r");
      if (end < 0) end = line.length;
      if (end > skip) masks.push([valueStart + skip, valueStart + end]);
      from = valueStart + end;
    }
  }
}

function schemeCredentials(text: string, masks: Mask[]): void {
  const low = lower(text);
  for (const [scheme, minLen] of [["bearer", 1], ["basic", 8]] as const) {
    let from = 0;
    let start: number;
    while ((start = low.indexOf(scheme, from)) >= 0) {
      from = start + scheme.length;
      const beforeOk = start === 0 || !asciiAlnum(low[start - 1]);
      const after = text.slice(from);
      const gap = lstripLength(after);
      if (!beforeOk || gap === 0) continue;
      const token = after.slice(gap);
      const length = [...Array(token.length).keys()].find((i) => endsToken(token[i]!)) ?? token.length;
      if (length >= minLen) {
        masks.push([from + gap, from + gap + length]);
        const word = lower(token.slice(0, length));
        if (word !== "bearer" && word !== "basic") from += gap + length;
      }
    }
  }
}

function secretKey(key: string): boolean {
  const k = lower(key);
  if (SECRET_KEY_PARTS.some((part) => k.includes(part))) return true;
  let last = k;
  for (const sep of "_-.") last = last.slice(last.lastIndexOf(sep) + 1);
  return SECRET_KEY_WORDS.includes(last);
}

function keyValues(text: string, masks: Mask[]): void {
  const n = text.length;
  let i = 0;
  while (i < n) {
    if (!keyChar(text[i])) {
      i++;
      continue;
    }
    const keyStart = i;
    while (i < n && keyChar(text[i])) i++;
    const keyEnd = i;
    if (!secretKey(text.slice(keyStart, keyEnd))) continue;
    let j = keyEnd;
    if (j < n && "\"'".includes(text[j]!)) j++;
    while (j < n && " \t".includes(text[j]!)) j++;
    if (!(j < n && "=:".includes(text[j]!))) continue;
    j++;
    while (j < n && " \t".includes(text[j]!)) j++;
    let valueStart: number;
    let valueEnd: number;
    if (j < n && "\"'".includes(text[j]!)) {
      const quote = text[j];
      valueStart = j + 1;
      valueEnd = n;
      let escaped = false;
      for (let k = valueStart; k < n; k++) {
        const ch = text[k];
        if (escaped) escaped = false;
        else if (ch === "\\") escaped = true;
        else if (ch === quote) {
          valueEnd = k;
          break;
        }
      }
    } else {
      let k = j;
      while (k < n && !(WHITESPACE.has(text[k]!) || "&,;}])\"'".includes(text[k]!))) k++;
      valueStart = j;
      valueEnd = k;
    }
    if (valueEnd > valueStart) masks.push([valueStart, valueEnd]);
    // Scan the value too: a key inside it has a value of its own.
    i = valueStart;
  }
}

function awsKeyIds(text: string, masks: Mask[]): void {
  for (const prefix of ["AKIA", "ASIA"]) {
    let from = 0;
    let start: number;
    while ((start = text.indexOf(prefix, from)) >= 0) {
      from = start + prefix.length;
      const ident = text.slice(from, from + 16);
      if (ident.length === 16 && /^[A-Z0-9]{16}$/.test(ident)) {
        masks.push([start, from + 16]);
        from += 16;
      }
    }
  }
}

function applyMasks(text: string, masks: Mask[]): string {
  if (masks.length === 0) return text;
  const out: string[] = [];
  let cursor = 0;
  let maskedTo: number | null = null;
  for (const [start, end] of [...masks].sort((a, b) => a[0] - b[0] || a[1] - b[1])) {
    if (end <= cursor) continue;
    if (maskedTo === null || start > maskedTo) {
      out.push(text.slice(cursor, start));
      out.push(MASK);
    }
    cursor = end;
    maskedTo = end;
  }
  out.push(text.slice(cursor));
  return out.join("");
}

/** Redacts the credential shapes listed above anywhere in `text`. */
export function redactText(text: string): string {
  const withUrls = redactUrlsInText(text);
  const masks: Mask[] = [];
  headerValues(withUrls, masks);
  schemeCredentials(withUrls, masks);
  keyValues(withUrls, masks);
  awsKeyIds(withUrls, masks);
  return applyMasks(withUrls, masks);
}

/** `scheme://user:password@host:port/path?query#fragment` → `scheme://user:***@host:port/path`. */
export function redactUrl(url: string): string {
  const parts = splitUrl(url);
  return redactText(parts !== null ? shown(parts) : url);
}

/** At most `maxBytes` bytes of UTF-8 on a character boundary, the cut marked with `…`. */
export function truncate(text: string, maxBytes: number): string {
  if (Buffer.byteLength(text, "utf8") <= maxBytes) return text;
  const ellipsis = "…";
  const limit = Math.max(0, maxBytes - Buffer.byteLength(ellipsis, "utf8"));
  let out = "";
  let size = 0;
  for (const ch of text) {
    const n = Buffer.byteLength(ch, "utf8");
    if (size + n > limit) break;
    out += ch;
    size += n;
  }
  return out + ellipsis;
}
