// The redactor gives the Rust library's and the Python client's output on their shared corpus
// (tests/python_client.rs, both_languages_redact_error_text_alike; the expected texts written
// by the Python client, which that test holds equal to Rust's).

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { headers } from "../dist/index.js";
import { redactText, redactUrl } from "../dist/redact.js";

const corpus = JSON.parse(readFileSync(new URL("./redact_corpus.json", import.meta.url), "utf8"));

test("every text of the corpus is redacted as in Rust and Python", () => {
  assert.ok(corpus.cases.length >= 19);
  for (const [text, byText, byUrl, asError] of corpus.cases) {
    assert.equal(redactText(text), byText, `redact_text(${JSON.stringify(text)})`);
    assert.equal(redactUrl(text), byUrl, `redact_url(${JSON.stringify(text)})`);
    assert.equal(headers.errorText(text), asError, `error_text(${JSON.stringify(text)})`);
  }
});
